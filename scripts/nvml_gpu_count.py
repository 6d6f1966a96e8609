"""Print how many GPUs NVML sees; exit 1 when there is no NVIDIA driver to ask.

Run by the Makefile with the system Python, before any virtual environment exists, to
decide whether `make venv` installs requirements-cuda.lock (~2.5 GB). Standard library
only: ctypes loads the driver's libnvidia-ml.so.1, which is where pynvml would load it
from too (https://docs.nvidia.com/deploy/nvml-api/group__nvmlInitializationAndCleanup.html).
"""

from __future__ import annotations

import ctypes
import sys

NVML_SUCCESS = 0


def nvml_gpu_count() -> int | None:
    """The number of GPUs NVML reports, or None without a driver or when NVML fails."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != NVML_SUCCESS:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
            return None
        return count.value
    finally:
        nvml.nvmlShutdown()


def main() -> int:
    count = nvml_gpu_count()
    if count is None:
        print("no NVIDIA driver answers (libnvidia-ml.so.1)", file=sys.stderr)
        return 1
    print(count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
