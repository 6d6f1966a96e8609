"""What `mgpu run` adds to a script's start, against plain `python`, side by side.

    .venv/bin/python benchmarks/run_overhead.py [--repeats 5] [--virtual-devices 0]

Two scripts, each started both ways, alternating, `--repeats` times, from a clock read just
before the process starts:
- first line: the script's first line prints the time. Under `mgpu run` this includes the
  settings, NVML, the pre-flight and TensorFlow's import with the device split and the
  precision policy, which `mgpu run` does before the script so its first layer takes them;
- strategy ready: the script imports TensorFlow and builds `tf.distribute.MirroredStrategy()`,
  what every training script does first: the cost that is really added.
Prints the medians (and min..max) in seconds and the difference. Settings: GPUS=none
(the CPU; on a GPU machine pass --gpus all), QUIET=1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FIRST_LINE = "import time; print(f'FIRST {time.time()}', flush=True)\n"
STRATEGY_READY = (
    "import time; print(f'FIRST {time.time()}', flush=True)\n"
    "import tensorflow as tf\n"
    "strategy = tf.distribute.MirroredStrategy()\n"
    "print(f'READY {time.time()} {strategy.num_replicas_in_sync}', flush=True)\n"
)


def measure(command: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Seconds from just before the process starts to each mark it prints, and to its exit."""
    started = time.time()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                            check=False, timeout=600)
    ended = time.time()
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    marks = {"exit": ended - started}
    for line in result.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("FIRST", "READY"):
            marks[word.lower()] = float(rest.split()[0]) - started
    return marks


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}..{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpus", default="none")
    parser.add_argument("--virtual-devices", default="0")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "MGPU_DEBUG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", QUIET="1", GPUS=args.gpus,
               VIRTUAL_DEVICES=args.virtual_devices)
    ways = {
        "python": [sys.executable],
        "mgpu run": [sys.executable, "-m", "entrypoint", "run"],
    }
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        (cwd / "first_line.py").write_text(FIRST_LINE)
        (cwd / "strategy_ready.py").write_text(STRATEGY_READY)
        results: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(args.repeats):
            for script, marks in (("first_line.py", ("first",)),
                                  ("strategy_ready.py", ("ready", "exit"))):
                for way, command in ways.items():  # alternating: drift hits both alike
                    measured = measure([*command, script], env, cwd)
                    for mark in marks:
                        results.setdefault((script, mark, way), []).append(measured[mark])
    print(f"seconds from process start, median (min..max) of {args.repeats}; "
          f"GPUS={args.gpus} VIRTUAL_DEVICES={args.virtual_devices}")
    print(f"{'':34}{'python':>22}{'mgpu run':>22}{'added':>10}")
    for script, mark, label in (
        ("first_line.py", "first", "to the script's first line"),
        ("strategy_ready.py", "ready", "to MirroredStrategy() built"),
        ("strategy_ready.py", "exit", "to exit (strategy script)"),
    ):
        plain, launched = results[(script, mark, "python")], results[(script, mark, "mgpu run")]
        added = statistics.median(launched) - statistics.median(plain)
        print(f"{label:34}{summary(plain):>22}{summary(launched):>22}{added:>+10.2f}")


if __name__ == "__main__":
    main()
