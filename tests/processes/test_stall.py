"""A real stall of `mgpu train` on the CPU: a MODEL whose layer blocks (a tf.py_function
that sleeps, as user code in a step can) at a chosen step. The stall watch names the phase
within STALL_TIMEOUT, prints every thread's stack (the blocked py_function's line among
them) and exits 3; the run folder's last checkpoint resumes afterwards. Held in C with the
GIL, the GIL-free backstop ends it instead (exit 1, faulthandler's stacks). A bad
STALL_TIMEOUT is exit 2 before anything starts."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from mgpu_env.config.exitcodes import EXIT_STALLED
from mgpu_env.training.multiworker.faults import BACKSTOP_GRACE_S
from mgpu_env.training.multiworker.stall import LOG_LINES, REARM_S
from mgpu_env.training.multiworker.stallhints import FIRST_STEP, MODEL, STEPS
from tests.support import train_process
from tests.support.children import REPO

HOOKS = REPO / "tests" / "fixtures" / "stall"
TIMEOUT_S = 4.0
# The watch polls every TIMEOUT_S / 10; the rest is the report's writing and the exit.
SLACK_S = 2.0
STEPS_PER_EPOCH = 22  # digits, 64 a batch
# What the model's layer prints from C++ in each step (`STALL_SAY`).
SAID = "stallmodel: a step's layer ran"


def stalled_run(tmp_path: Path, stall_at: int, args: tuple[str, ...] = (), **settings: str
                ) -> tuple[subprocess.CompletedProcess[str], float]:
    """The run, and the seconds from the block's start to the process's end."""
    mark = tmp_path / "blocked-at"
    process = train_process.start(
        tmp_path / "run", *args, PYTHONPATH=f"{HOOKS}:{REPO}", MODEL="stallmodel:build",
        EPOCHS="2", STALL_AT=str(stall_at), STALL_MARK=str(mark),
        **{"STALL_TIMEOUT": f"{TIMEOUT_S:g}", **settings},
    )
    stdout, stderr = process.communicate(timeout=300)
    ended = time.time()
    assert mark.is_file(), stderr[-3000:]
    waited = ended - float(mark.read_text())
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), waited


@pytest.mark.slow
def test_a_stall_in_the_steps_is_named_within_the_bound_and_the_run_resumes(
    tmp_path: Path
) -> None:
    # Epoch 2's third step: epoch 1's checkpoint is written.
    result, waited = stalled_run(tmp_path, STEPS_PER_EPOCH + 3, STALL_SAY=SAID)
    assert result.returncode == EXIT_STALLED, result.stderr[-3000:]
    assert TIMEOUT_S - 1 <= waited < TIMEOUT_S + SLACK_S, waited
    stderr = result.stderr
    # The step's C++ print (fd 2, unseen by Python) reached stderr as it ran, and the
    # report's last lines of stderr end with it.
    before, _, report = stderr.partition("error: the run stalled")
    assert SAID in before
    _, _, last = report.partition("The last lines on stderr (TensorFlow's and NCCL's C++ "
                                  "logs among them; NCCL_DEBUG=INFO adds NCCL's):\n")
    kept = last.partition("Each thread's Python stack")[0].splitlines()
    assert 0 < len(kept) <= LOG_LINES and kept[-1] == f"  {SAID}", report[:3000]
    assert (f"error: the run stalled: no progress for {TIMEOUT_S:g} s (STALL_TIMEOUT=4s) in "
            f"{STEPS}") in stderr
    assert "one replica: no collective is involved" in stderr
    assert "Thread MainThread:" in stderr
    assert 'stallmodel.py", line' in stderr and "in block_here" in stderr
    assert "Traceback" not in stderr
    assert (tmp_path / "run" / "checkpoints" / "checkpoint").read_text().startswith(
        'model_checkpoint_path: "ckpt-1"')
    # The same folder, no block: resumed from epoch 1's checkpoint and finished.
    again = train_process.run(tmp_path / "run", PYTHONPATH=f"{HOOKS}:{REPO}",
                              MODEL="stallmodel:build", EPOCHS="2", QUIET="0")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Resuming from the checkpoint of epoch 1" in again.stdout
    finished = train_process.metrics(tmp_path / "run")
    assert finished["epochs_completed"] == 2 and finished["resumed_from_epoch"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(("stall_at", "phase"), [(1, MODEL), (2, FIRST_STEP)])
def test_a_stall_before_the_steps_is_named_by_its_phase(
    tmp_path: Path, stall_at: int, phase: str
) -> None:
    # The layer runs once as the model is built (its variables made), then in each step.
    result, waited = stalled_run(tmp_path, stall_at)
    assert result.returncode == EXIT_STALLED, result.stderr[-3000:]
    # The bound runs from the phase's start, a little before the block (the step's trace).
    assert waited < TIMEOUT_S + SLACK_S, waited
    assert f"in {phase}." in result.stderr
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint").exists()


@pytest.mark.slow
def test_a_stall_that_holds_the_gil_is_ended_by_the_backstop(tmp_path: Path) -> None:
    result, waited = stalled_run(tmp_path, STEPS_PER_EPOCH + 3, STALL_GIL="1", STALL_SAY=SAID)
    assert result.returncode == 1, result.stderr[-3000:]
    # All that C++ wrote, the print just before the block included (once per execution of
    # the layer, the block's own too), reached stderr though no thread of this process ran
    # after the block: stderr's tail is copied by another process.
    assert result.stderr.count(SAID) == STEPS_PER_EPOCH + 3
    # The timer was last armed at the phase's last progress, up to REARM_S before the block.
    bound = TIMEOUT_S + BACKSTOP_GRACE_S + REARM_S
    assert bound - REARM_S <= waited < bound + SLACK_S, waited
    # faulthandler's dump, written with no GIL: the blocked line is in it.
    assert "Timeout (0:00:10)!" in result.stderr
    assert 'stallmodel.py", line' in result.stderr
    assert (tmp_path / "run" / "checkpoints" / "checkpoint").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("value", ["never", "0.5s", "-1"])
def test_a_bad_stall_timeout_is_exit_2(tmp_path: Path, value: str) -> None:
    result = train_process.run(tmp_path / "run", "--dry-run", STALL_TIMEOUT=value)
    assert result.returncode == 2
    assert f"STALL_TIMEOUT='{value}'" in result.stderr and "Valid: auto, 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_worker_that_never_joins_the_first_all_reduce_is_named_by_the_launcher(
    tmp_path: Path
) -> None:
    """`mgpu train --workers 2`: worker 1 blocks in its first step, so worker 0's first
    all-reduce never completes. The first to reach its bound reports its phase; the launcher
    names that worker and the phase, and exits 3; no checkpoint was begun. The bound is
    the time a worker's first step may wait for the other's trace and compile on a busy
    2-core machine (4 s was not)."""
    bound = 20
    result, waited = stalled_run(tmp_path, 2, STALL_WORKER="1", WORKER_TIMEOUT="60",
                                 STALL_TIMEOUT=str(bound), args=("--workers", "2"))
    assert result.returncode == EXIT_STALLED, result.stderr[-3000:]
    assert waited < bound + SLACK_S, waited
    said = re.search(r"mgpu: worker (\d) exited 3 \(stalled: worker (\d) \([^)]*\): the run "
                     rf"stalled: no progress for {bound} s \(STALL_TIMEOUT={bound}s\) in "
                     f"{re.escape(FIRST_STEP)}", result.stderr)
    assert said is not None and said[1] == said[2], result.stderr[-3000:]
    worker = said[1]
    report = "\n".join(line.removeprefix(f"[worker {worker}] ")
                       for line in result.stderr.splitlines()
                       if line.startswith(f"[worker {worker}] "))
    assert "the all-reduce between the 2 workers (2 replicas) never completed" in report
    if worker == "1":
        assert "in block_here" in report
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint").exists()
