"""The scan judged on scripts kept apart from the rules (tests/keras2_scripts/apart/).

    .venv/bin/python tests/keras2_scripts/judge.py        # from the repository root

Each script is one minimal shape of code of its own (not a rule's test snippet). For each,
what a correct reading should say (`SHOULD`, written with the script), what the scan says
(TensorFlow changes, Keras 2 code, results read by position) and how long it took, and what
the script really does under plain `python` with tf.keras = Keras 3 and = tf_keras: its exit
code and last line. A row where the scan and the run disagree is a miss of the rules.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mgpu_env.launcher.source_scan import scan_script

APART = Path(__file__).parent / "apart"
# What a correct reading says of each script (the key of the change, "order", "keras_2" or
# "" for nothing to tell).
SHOULD = {
    "cast_inline.py": "",
    # The second set, written after the first judged the rules (and before judging these):
    "cosine_warmup.py": "schedule-int64-arithmetic",
    "data_autotune.py": "",
    "evaluate_dict_unpack.py": "order (a miss of the second set: `.values()` of the call "
                               "itself; now read)",
    "get_updates_wrapper.py": "optimizer-updates",
    "tf1_logging.py": "tf1-api",
    "train_on_batch_loop.py": "",
    "decay_schedule.py": "schedule-int64-arithmetic (first judged: found, but said to fail "
                         "under both Keras; Keras 3 runs it)",
    "estimator_import.py": "estimator",
    "history_keys.py": "order",
    "keras3_native.py": "",
    "reduce_without_axis.py": "strategy.reduce without axis (TF 2.0; a miss, now reduce-axis)",
    "step_plus_one.py": "schedule-int64-step (a miss: `step = step + 1` was taken for a cast)",
    "tf1_plain.py": "tf1-api",
    "tf1_under_compat.py": "",
    "two_heads_eval.py": "order",
    "type_check.py": "tensor-type",
}


def told(path: Path) -> tuple[str, float]:
    times = []
    for _ in range(20):
        started = time.perf_counter()
        scan = scan_script(path)
        times.append(time.perf_counter() - started)
    found = [f"{f.kind}:{f.api}@{f.line}" for f in (*scan.removed, *scan.keras_2,
                                                      *scan.positional)]
    return "; ".join(found) or "-", statistics.median(times) * 1000


def ran(path: Path, legacy: str) -> str:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": legacy, "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    lines = (done.stderr if done.returncode else done.stdout).strip().splitlines() or [""]
    return f"rc={done.returncode} {lines[-1][:90]}"


def main() -> None:
    for path in sorted(APART.glob("*.py")):
        found, median_ms = told(path)
        print(f"{path.name}\n  should: {SHOULD.get(path.name, '?') or '-'}\n"
              f"  scan ({median_ms:.2f} ms median of 20): {found}")
        if "--no-run" not in sys.argv:
            print(f"  Keras 3: {ran(path, '0')}\n  tf_keras: {ran(path, '1')}")


if __name__ == "__main__":
    main()
