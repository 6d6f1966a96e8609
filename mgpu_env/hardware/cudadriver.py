"""CUDA's own initialisation, between NVML and TensorFlow: the driver API probe.

NVML can answer while CUDA cannot start: the `nvidia_uvm` module missing or broken after a
suspend (CUDA_ERROR_UNKNOWN), no /dev/nvidia-uvm in a container, a forward-compatibility
`libcuda.so.1` from a `cuda/compat` folder on a GPU that does not support it (804). TensorFlow
then lists no GPU and says why only in its log. This probe asks CUDA directly, in a small child
Python (it imports nothing but ctypes: tens of milliseconds) with a timeout, so a hanging or
crashing driver never takes the doctor down:

- which `libcuda.so.1` the dynamic loader takes (its file, from /proc/self/maps after dlopen:
  LD_LIBRARY_PATH first, as for TensorFlow),
- `cuDriverGetVersion` (the CUDA that library supports),
- `cuInit(0)` and its CUresult,
- `cuDeviceGetCount` (with the run's CUDA_VISIBLE_DEVICES) to compare with NVML.

`collect` never raises: what it cannot learn is a `Probed` error ("could not collect (why)").
Tests replace `collect`, or run it for real against fake `libcuda.so.1` files built with gcc.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from mgpu_env.hardware import childprobe
from mgpu_env.hardware.nvml import Probed

JSON_MARKER = "MGPU_CUDADRIVER_JSON "
DEFAULT_TIMEOUT_S = 6.0

# Run as `python -I -S -c CHILD`: no site, no mgpu import, so it starts in milliseconds.
CHILD = r"""
import ctypes, json, os, sys
out = {"library": None, "driver_version": None, "init_code": None, "device_count": None,
       "error": None}
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError as err:
    out["error"] = str(err)
else:
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libcuda.so"):
                out["library"] = parts[5].strip()
                break
    version = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            out["driver_version"] = version.value
        out["init_code"] = int(lib.cuInit(0))
        if out["init_code"] == 0:
            count = ctypes.c_int(0)
            if lib.cuDeviceGetCount(ctypes.byref(count)) == 0:
                out["device_count"] = count.value
    except AttributeError as err:
        out["error"] = "not a CUDA driver library: " + str(err)
print("MARKER" + json.dumps(out), flush=True)
""".replace("MARKER", JSON_MARKER)


@dataclass(frozen=True)
class DriverApi:
    """What CUDA's driver API says in a process with the run's environment."""

    library: str | None = None  # the libcuda.so.1 file the loader mapped; None: none loads
    load_error: str | None = None  # dlerror() when no libcuda.so.1 loads
    driver_version: int | None = None  # cuDriverGetVersion: 12050 = CUDA 12.5
    init_code: int | None = None  # cuInit(0)'s CUresult; 0 = CUDA_SUCCESS
    device_count: int | None = None  # cuDeviceGetCount after a successful cuInit

    @property
    def initialised(self) -> bool:
        return self.init_code == 0

    @property
    def cuda_version(self) -> str | None:
        v = self.driver_version
        return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def parse(stdout: str) -> DriverApi:
    """The child's answer. Raises ValueError when there is none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(JSON_MARKER):
            return _from_json(line.removeprefix(JSON_MARKER))
    raise ValueError("no answer")


def _from_json(text: str) -> DriverApi:
    data = json.loads(text)
    return DriverApi(
        library=data.get("library"), load_error=data.get("error"),
        driver_version=data.get("driver_version"), init_code=data.get("init_code"),
        device_count=data.get("device_count"),
    )


def collect(environ: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> Probed[DriverApi]:
    """Ask CUDA's driver API in a child with `environ`. Never raises."""
    done = childprobe.ask([sys.executable, "-I", "-S", "-c", CHILD], environ,
                          marker=JSON_MARKER, timeout_s=timeout_s)
    if done.start_error is not None:
        return Probed(error=done.start_error)
    if done.timed_out:
        return Probed(error=f"cuInit did not return within {timeout_s:g} s (a hung driver: "
                            "`dmesg` shows NVRM/Xid messages)")
    try:
        if done.answer is None:
            raise ValueError("no answer")
        return Probed(value=_from_json(done.answer))
    except (ValueError, KeyError, TypeError, AttributeError):
        return Probed(error=done.exited("the driver probe", lines=2))
