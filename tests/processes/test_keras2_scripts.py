"""The corpus: public scripts nobody here wrote, each under `mgpu run` on 2 logical CPUs.

tests/keras2_scripts/ holds TensorFlow's own tutorials and guides and a well-known course's
MirroredStrategy labs, converted from their notebooks by tests/keras2_scripts/convert.py
(each file's header names its origin, commit and the lines changed: notebook-only `!`/`%`
lines only). Most were written for Keras 2 (`tf.keras` before TensorFlow 2.16). Under
KERAS=auto each one either trains to its end, or fails in Keras 3 and ends with mgpu's note
naming KERAS=2 and the command; for those, the test reruns the command the note gives and
it trains.

The data sets are downloads, and nothing is downloaded here: each test writes small,
learnable stand-ins where Keras caches them (MNIST, Fashion-MNIST) in an empty HOME;
tests/tutorials/offline lets the MNIST stand-in pass Keras' hash check, and
tests/keras2_scripts/offline serves `tfds.load('mnist')` from the same file. Sizes are per
script: as small as its code allows (the mixed-precision guide reshapes to 60000 x 784).

Measured here (TensorFlow 2.21, Keras 3.15, tf_keras 2.21; GPUS=none VIRTUAL_DEVICES=2;
`.venv/bin/python -m tests.keras2_scripts.measure`, with `--repo` on a checkout of 9dbc031
for "before"): before the source scan, KERAS=auto gave every one Keras 3 on one machine and
4 of the first 11 trained. Before the Keras 3 break rules (9dbc031), of the 13 now here 9
trained (4 on tf_keras chosen at the start), 3 ended with the KERAS=2 note (2 of them only
at their first save, after training) and 1, keras-io's 2020 guide, failed with a bare
traceback at its first checkpoint ("The filepath provided must end in `.keras`"). Now 12
train (7 on tf_keras chosen from their source before the first step, each with the line and
why) and 1 (`compile` outside the scope, which the source does not show) ends with the note
when `fit` starts, before its first step; its command trains it. The replicas each one ran
with, as observed at its first step, against the 2 planned: 2 for the 5 of the 6 that build
MirroredStrategy() and step under it (the 6th, compiled outside its scope, fails before its
first step: nothing is said of a strategy); 1 for the 6 that build none (the 4 that `fit`
run on TensorFlow's default strategy, the 2 custom loops on none, seen by their gradient:
mgpu's end line says so, with the fix); 2 of 4 planned for the distributed-input tutorial,
which splits the CPU in 2 itself (said at the strategy and at the end).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.support.corpus import CORPUS, RERUN_MARK, SCRIPTS, Script, run_script

pytestmark = pytest.mark.slow


def rerun_settings(stderr: str, script: Path) -> dict[str, str]:
    """The settings of the command the note's last line gives (`KERAS=2 mgpu run ...`)."""
    words = shlex.split(stderr.strip().splitlines()[-1].split(RERUN_MARK, 1)[1])
    start = words.index("mgpu")
    assert words[start:] == ["mgpu", "run", str(script)], words
    return dict(word.split("=", 1) for word in words[:start])


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_each_public_script_trains_under_keras_auto_or_ends_with_the_note(
    tmp_path: Path, script: Script
) -> None:
    result = run_script(tmp_path, script)
    summary = result.stderr
    label = "Keras 2 (tf_keras)" if script.keras == "2" else "Keras 3"
    assert f"tf.keras {label}" in summary, summary[-3000:]
    if script.keras == "2":
        assert "keras: KERAS=auto: the script uses what only Keras 2 has" in summary
    assert script.says in summary
    if script.keras == "2":  # before the first step: the line that says why
        assert "  keras 2 code: `" in summary and ": Keras 3" in summary
    if script.ran:
        assert f"mgpu run: strategy that ran: {script.ran}" in summary, summary[-3000:]
    else:  # no step ran: no advice about a strategy
        assert "strategy that ran" not in summary, summary[-3000:]
    if script.trains:
        assert result.returncode == 0, result.stderr[-4000:]
        assert script.done in result.stdout, result.stdout[-3000:]
        return
    assert result.returncode == 1, result.stderr[-4000:]
    last = result.stderr.strip().splitlines()[-1]
    assert RERUN_MARK in last and f"KERAS=2 mgpu run {CORPUS / script.name}" in last, last
    # The note's command: the script trains to its end.
    (tmp_path / "again").mkdir()
    settings = rerun_settings(result.stderr, CORPUS / script.name)
    assert settings == {"KERAS": "2"}
    again = run_script(tmp_path / "again", script, **settings)
    assert again.returncode == 0, again.stderr[-4000:]
    assert script.done in again.stdout, again.stdout[-3000:]
