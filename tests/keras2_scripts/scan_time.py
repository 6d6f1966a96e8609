"""How long `mgpu run`'s source scan takes before the script starts, per corpus script.

    .venv/bin/python tests/keras2_scripts/scan_time.py    # from the repository root

Each script is scanned 20 times in this process (`launcher.scan_target`, what `mgpu run`
calls before it builds the runtime); the median and the slowest are printed.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from mgpu_env import launcher

ROUNDS = 20


def main() -> None:
    scripts = sorted(Path(__file__).parent.glob("*_*.py"))
    for path in [p for p in scripts if p.name != "scan_time.py"]:
        target = launcher.resolve_target([str(path)], module=False)
        times = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            scan = launcher.scan_target(target)
            times.append(time.perf_counter() - started)
        lines = len(path.read_text().splitlines())
        print(f"{path.name:42s} files={len(scan.files)} lines={lines:4d} "
              f"median={statistics.median(times) * 1000:6.2f} ms max={max(times) * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
