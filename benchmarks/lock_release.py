"""How soon a run folder is free again after its holder is killed with `kill -9`.

    .venv/bin/python benchmarks/lock_release.py [--folder-in DIR] [--rounds 20]

Each round starts a process that holds a fresh run folder as `mgpu train` does
(`training.run.hold.hold_run_folder`: a POSIX record lock on `run.lock`), checks that a
second hold is refused, sends the holder SIGKILL and tries to hold the folder again, without
waiting between tries, until it succeeds. Printed: the median and max milliseconds from the
kill to the successful hold, and how many tries were refused before it (0 where the
kernel had dropped the lock before the first try). `--folder-in` picks the file system
(default: the temporary folder's).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.run.hold import hold_run_folder

HOLDER = """
import sys, time
from pathlib import Path
from mgpu_env.training.run.hold import hold_run_folder
hold = hold_run_folder(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def one_round(folder: Path) -> tuple[float, int]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    try:
        hold_run_folder(folder).release()
        raise SystemExit("a second hold was not refused")
    except ConfigError:
        pass
    killed = time.perf_counter()
    holder.send_signal(signal.SIGKILL)
    refused = 0
    while True:
        try:
            hold = hold_run_folder(folder)
            break
        except ConfigError:
            refused += 1
    took = time.perf_counter() - killed
    holder.wait()
    hold.release()
    return took, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder-in", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(dir=args.folder_in)) / "run"
    results = [one_round(folder) for _ in range(args.rounds)]
    seconds = [r[0] for r in results]
    print(f"{folder}: {args.rounds} kill -9s; the next hold after median "
          f"{statistics.median(seconds) * 1e3:.1f} ms, max {max(seconds) * 1e3:.1f} ms; "
          f"tries refused before it: median {statistics.median(r[1] for r in results):.0f}")


if __name__ == "__main__":
    main()
