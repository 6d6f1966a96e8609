"""The CUDA driver API's result codes users meet at start-up, each with its cause and fix.

The codes and names are CUDA's `CUresult` (cuda.h). The causes and fixes are the ones public
bug threads converged on; `mgpu doctor` prints them for the code `cuInit` returned (the
driver probe, `cudadriver`) or the code TensorFlow's log names (`tflog`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIX_UVM = (
    "load the CUDA unified-memory module and its device file: `sudo nvidia-modprobe -u -c=0` "
    "(or `sudo modprobe nvidia_uvm`); after a suspend: `sudo rmmod nvidia_uvm && sudo "
    "modprobe nvidia_uvm`, or reboot"
)
FIX_UVM_CONTAINER = (
    "the container has no /dev/nvidia-uvm: on the host run `sudo nvidia-modprobe -u -c=0` "
    "(it creates /dev/nvidia-uvm), then recreate the container (`docker compose up "
    "--force-recreate`); with a runtime that does not add it: `--device /dev/nvidia-uvm "
    "--device /dev/nvidia-uvm-tools`"
)
FIX_COMPAT = (
    "remove the CUDA forward-compatibility folder (`.../cuda/compat`, `.../cuda-12.x/compat`) "
    "from LD_LIBRARY_PATH so that the driver's own libcuda.so.1 loads: forward compatibility "
    "works only on data-centre GPUs with a matching driver branch"
)
FIX_DRIVER_MISMATCH = (
    "the NVIDIA kernel module and its libcuda.so.1 are of different driver versions (an "
    "upgrade without a reboot): reboot, or reload the modules (`sudo rmmod nvidia_uvm "
    "nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`)"
)
FIX_STUB = (
    "remove the CUDA toolkit's `lib64/stubs` folder from LD_LIBRARY_PATH: its libcuda.so is a "
    "link-time stub, not a driver"
)


@dataclass(frozen=True)
class CudaError:
    code: int
    name: str
    cause: str
    fix: str


ERRORS: dict[int, CudaError] = {e.code: e for e in (
    CudaError(0, "CUDA_SUCCESS", "", ""),
    CudaError(1, "CUDA_ERROR_INVALID_VALUE",
              "cuInit was called with flags this driver rejects (a libcuda.so.1 that is not "
              "the driver's, or a wrapper around it)",
              "`ldconfig -p | grep libcuda` and the library named here: the driver's "
              "libcuda.so.1 must load first; remove other copies from LD_LIBRARY_PATH"),
    CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY",
              "GPU memory is exhausted already at start-up: another process holds it",
              "`nvidia-smi` shows which process holds the GPU: stop it, or choose other GPUs "
              "with GPUS=..."),
    CudaError(3, "CUDA_ERROR_NOT_INITIALIZED", "the driver did not initialise",
              "see the Driver (NVML) line; reinstall or reload the NVIDIA driver"),
    CudaError(4, "CUDA_ERROR_DEINITIALIZED",
              "the CUDA driver is shutting down in this process",
              "run again; if it persists, `sudo dmesg | grep -i nvrm` shows the driver's error"),
    CudaError(34, "CUDA_ERROR_STUB_LIBRARY",
              "the libcuda.so.1 the loader found is the CUDA toolkit's stub, not the driver",
              FIX_STUB),
    CudaError(35, "CUDA_ERROR_INSUFFICIENT_DRIVER",
              "the NVIDIA driver is older than the CUDA runtime TensorFlow uses",
              "upgrade the host's NVIDIA driver (see the Driver version line)"),
    CudaError(46, "CUDA_ERROR_DEVICE_UNAVAILABLE",
              "the GPUs are busy or unavailable: exclusive-process compute mode with another "
              "process on them, or compute prohibited",
              "`nvidia-smi -q -d COMPUTE` shows the mode: stop the process using the GPU, "
              "choose other GPUs with GPUS=..., or `sudo nvidia-smi -c DEFAULT`"),
    CudaError(100, "CUDA_ERROR_NO_DEVICE",
              "CUDA sees no GPU: CUDA_VISIBLE_DEVICES hides them, or the kernel driver "
              "does not run here",
              "unset CUDA_VISIBLE_DEVICES (GPUS chooses the GPUs); in a container start it "
              "with the GPUs (`--gpus all`); on a host check `nvidia-smi`"),
    CudaError(101, "CUDA_ERROR_INVALID_DEVICE", "a GPU index that does not exist",
              "unset CUDA_VISIBLE_DEVICES and choose the GPUs with GPUS=..."),
    CudaError(218, "CUDA_ERROR_INVALID_PTX",
              "the driver cannot compile the PTX the build carries for this GPU",
              "see the GPU lines: use a TensorFlow built for this GPU"),
    CudaError(222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
              "the build's PTX is newer than this driver can compile",
              "upgrade the host's NVIDIA driver (see the Driver version line)"),
    CudaError(303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
              "the driver's libraries failed to initialise (often /dev/nvidia-uvm missing or "
              "the nvidia_uvm module not loaded)", FIX_UVM),
    CudaError(304, "CUDA_ERROR_OPERATING_SYSTEM",
              "an OS call of the driver failed (often /dev/nvidia-uvm missing or unreadable)",
              FIX_UVM),
    CudaError(802, "CUDA_ERROR_SYSTEM_NOT_READY",
              "the system is not ready: on NVSwitch machines the fabric manager is not running",
              "`sudo systemctl enable --now nvidia-fabricmanager` (the same version as the "
              "driver)"),
    CudaError(803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
              "libcuda.so.1 does not match the kernel driver (a forward-compatibility "
              "library for another driver branch, or a driver upgraded without a reboot)",
              FIX_DRIVER_MISMATCH),
    CudaError(804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
              "a CUDA forward-compatibility libcuda.so.1 was loaded, which this GPU does not "
              "support (GeForce and most workstation GPUs)", FIX_COMPAT),
    CudaError(805, "CUDA_ERROR_MPS_CONNECTION_FAILED",
              "the CUDA MPS server cannot be reached",
              "start the MPS daemon (`nvidia-cuda-mps-control -d`) or unset "
              "CUDA_MPS_PIPE_DIRECTORY"),
    CudaError(806, "CUDA_ERROR_MPS_RPC_FAILURE",
              "the CUDA MPS server failed to answer (it died or was restarted)",
              "restart the MPS daemon (`echo quit | nvidia-cuda-mps-control; "
              "nvidia-cuda-mps-control -d`) or unset CUDA_MPS_PIPE_DIRECTORY"),
    CudaError(807, "CUDA_ERROR_MPS_SERVER_NOT_READY",
              "the CUDA MPS server is not ready yet (starting, or recovering from a fault)",
              "wait and run again; `nvidia-cuda-mps-control` logs say why it is not ready"),
    CudaError(808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
              "the CUDA MPS server already serves as many clients as it allows",
              "stop other MPS clients, or raise the limit (`set_default_client_limit` "
              "... see `man nvidia-cuda-mps-control`)"),
    CudaError(809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
              "the CUDA MPS server has no connection left for this process",
              "stop other MPS clients, or unset CUDA_MPS_PIPE_DIRECTORY to run without MPS"),
    CudaError(810, "CUDA_ERROR_MPS_CLIENT_TERMINATED",
              "the CUDA MPS server terminated this client (a fault in another client)",
              "restart the MPS daemon and run again"),
    CudaError(999, "CUDA_ERROR_UNKNOWN",
              "the driver failed with an unknown error: the nvidia_uvm module is not loaded "
              "or broken (typically after a suspend), or /dev/nvidia-uvm is missing", FIX_UVM),
)}
BY_NAME = {e.name: e.code for e in ERRORS.values()}


def describe(code: int) -> CudaError:
    """The known error for `code`, or a generic one naming the number."""
    return ERRORS.get(code, CudaError(
        code, f"CUresult {code}", f"the CUDA driver failed with result code {code}",
        "see cuda.h's CUresult for the code; `nvidia-smi` and the Driver lines above"))


def name(code: int) -> str:
    return describe(code).name


_NUMBER = re.compile(r"(?:UNKNOWN ERROR|error|code)\s*\(?(\d{1,4})\)?", re.I)


def code_in(text: str) -> int | None:
    """The first CUresult named in `text` (`CUDA_ERROR_UNKNOWN`, `UNKNOWN ERROR (303)`)."""
    names = re.findall(r"CUDA_ERROR_[A-Z_]+", text)
    for found in names:
        if found in BY_NAME:
            return BY_NAME[found]
    match = _NUMBER.search(text)
    if match and int(match.group(1)) in ERRORS:
        return int(match.group(1))
    return None
