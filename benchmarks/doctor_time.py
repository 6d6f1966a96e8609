"""Wall time of `mgpu doctor --no-tf` (the NVML and host part; no TensorFlow) and of the
doctor's own work inside it, as medians over --runs fresh processes.

    .venv/bin/python benchmarks/doctor_time.py --runs 5

The target: well under a second on a healthy, quiet host. Run it on a quiet machine; on a
busy one the start of Python and the CLI's imports dominate.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

INSIDE = (
    "import os, time\n"
    "start = time.perf_counter()\n"
    "from mgpu_env.config.resolve import resolve_settings\n"
    "from mgpu_env.doctor import diagnose\n"
    "diagnose(resolve_settings({}, {}), os.environ, with_tensorflow=False)\n"
    "print(time.perf_counter() - start)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    whole, inside = [], []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "entrypoint", "doctor", "--no-tf"],
                       capture_output=True, check=False)
        whole.append(time.perf_counter() - start)
        done = subprocess.run([sys.executable, "-c", INSIDE], capture_output=True, text=True,
                              check=True)
        inside.append(float(done.stdout.strip()))
    print(f"mgpu doctor --no-tf: median {statistics.median(whole):.2f} s "
          f"(range {min(whole):.2f}-{max(whole):.2f}, {runs} runs)")
    print(f"  the doctor's own work (imports and checks): median "
          f"{statistics.median(inside):.2f} s (range {min(inside):.2f}-{max(inside):.2f})")


if __name__ == "__main__":
    main()
