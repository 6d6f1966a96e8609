"""NVML's return codes, each with what it says is broken, its cause and its fix.

NVML's return codes (nvml.h `nvmlReturn_t`, nvidia-ml-py's `NVML_ERROR_*`), each with what it
says is broken, its generic cause and its fix.

`scope` is what the code says about the machine, which decides what the doctor does with it:

- `query`: this one question has no answer here (a board without ECC, an old driver without
  the function); the field is "could not collect (why)", the GPU stays usable;
- `device`: the GPU that answered it is unusable (fallen off the bus, needs a reset); the other
  GPUs stay usable and `GPUS=` can keep them;
- `system`: NVML itself cannot work here (no driver, a library of another driver version, no
  permission on /dev/nvidia*); no GPU is usable.

The generic cause and fix are refined with the machine's own facts (`nvidiahost`) by the
doctor (`mgpu_env.doctor.checks.nvmlcause`). `tests/unit/test_nvml_codes.py` walks every
`NVML_ERROR_*` the installed nvidia-ml-py defines through this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["query", "device", "system"]

FIX_RESET = (
    "reset the GPU when nothing runs on it (`sudo nvidia-smi -r -i <bus id>`), else reboot; "
    "`sudo dmesg | grep -i xid` shows why it failed"
)
FIX_LOST = (
    "the GPU fell off the bus (`sudo dmesg | grep -i xid` shows Xid 79): reboot or power-cycle "
    "the machine; if it recurs, check the GPU's power cables, riser and temperature"
)
FIX_QUERY = "nothing to do: the report shows this field as could not collect"
FIX_DRIVER_UPGRADE_NVML = (
    "this NVML is older than the question (an old driver): upgrade the NVIDIA driver for the "
    "field, or ignore it"
)


@dataclass(frozen=True)
class NvmlError:
    """One NVML return code: its name, what it breaks, the generic cause and fix."""

    code: int
    name: str
    scope: Scope
    cause: str
    fix: str


ERRORS: dict[int, NvmlError] = {e.code: e for e in (
    NvmlError(0, "NVML_SUCCESS", "query", "", ""),
    NvmlError(1, "NVML_ERROR_UNINITIALIZED", "system",
              "NVML was asked before nvmlInit succeeded (a probe bug, or the driver went away "
              "while it ran)", "run `mgpu doctor` again; `nvidia-smi` must answer"),
    NvmlError(2, "NVML_ERROR_INVALID_ARGUMENT", "query",
              "NVML rejected the question for this GPU (a field this board does not have)",
              FIX_QUERY),
    NvmlError(3, "NVML_ERROR_NOT_SUPPORTED", "query",
              "this GPU or driver does not report this field (GeForce boards, vGPU, MIG)",
              FIX_QUERY),
    NvmlError(4, "NVML_ERROR_NO_PERMISSION", "system",
              "no permission to open the NVIDIA device files (/dev/nvidiactl, /dev/nvidia<N>)",
              "give the user read-write access to /dev/nvidia*: add it to the group that owns "
              "them (`sudo usermod -aG <group> $USER`, then log in again), or in a container "
              "start it with the GPUs (`--gpus all`)"),
    NvmlError(5, "NVML_ERROR_ALREADY_INITIALIZED", "query",
              "NVML was already started in this process (harmless)", FIX_QUERY),
    NvmlError(6, "NVML_ERROR_NOT_FOUND", "query",
              "NVML found nothing for this question (no process, no such object)", FIX_QUERY),
    NvmlError(7, "NVML_ERROR_INSUFFICIENT_SIZE", "query",
              "NVML's answer did not fit nvidia-ml-py's buffer (nvidia-ml-py older than the "
              "driver)", "upgrade nvidia-ml-py (`make locks UPGRADE=--upgrade-package="
              "nvidia-ml-py`)"),
    NvmlError(8, "NVML_ERROR_INSUFFICIENT_POWER", "device",
              "the GPU's external power cables are not connected properly",
              "power the machine off and seat the GPU's PCIe power cables (8-pin/12VHPWR); "
              "`nvidia-smi -q -d POWER` shows the board's power state"),
    NvmlError(9, "NVML_ERROR_DRIVER_NOT_LOADED", "system",
              "the NVIDIA kernel module is not loaded",
              "load it (`sudo modprobe nvidia`: its message says why it cannot, e.g. Secure "
              "Boot or a module not built for this kernel), or install the NVIDIA driver"),
    NvmlError(10, "NVML_ERROR_TIMEOUT", "device",
              "the GPU did not answer in time (hung, or busy resetting)", FIX_RESET),
    NvmlError(11, "NVML_ERROR_IRQ_ISSUE", "device",
              "the kernel driver has a problem with the GPU's interrupts (MSI off, a "
              "virtualised or broken PCIe slot)",
              "`sudo dmesg | grep -i nvrm` shows the interrupt error: enable MSI "
              "(`NVreg_EnableMSI=1`), update the BIOS, or move the GPU to another slot"),
    NvmlError(12, "NVML_ERROR_LIBRARY_NOT_FOUND", "system",
              "libnvidia-ml.so.1 (the driver's NVML library) is not installed or not on the "
              "loader's path",
              "install the NVIDIA driver (`nvidia-smi` must work), or set GPUS=none to train "
              "on the CPU"),
    NvmlError(13, "NVML_ERROR_FUNCTION_NOT_FOUND", "query",
              "the installed NVML lacks this function (a driver older than nvidia-ml-py)",
              FIX_DRIVER_UPGRADE_NVML),
    NvmlError(14, "NVML_ERROR_CORRUPTED_INFOROM", "device",
              "the GPU's infoROM is corrupted (ECC and other records cannot be kept)",
              "`nvidia-smi -q | grep -i inforom` shows it; the board needs an infoROM update "
              "or an RMA from its vendor; exclude it with GPUS= meanwhile"),
    NvmlError(15, "NVML_ERROR_GPU_IS_LOST", "device",
              "the GPU has fallen off the bus or is otherwise inaccessible", FIX_LOST),
    NvmlError(16, "NVML_ERROR_RESET_REQUIRED", "device",
              "the GPU needs a reset before it can be used again (after an Xid, pending "
              "retired pages or row remapping)", FIX_RESET),
    NvmlError(17, "NVML_ERROR_OPERATING_SYSTEM", "system",
              "an operating-system call of NVML failed (the GPU is blocked from NVML by the "
              "OS, a cgroup, or a missing device file)",
              "`sudo dmesg | grep -i nvrm` shows the error; in a container recreate it "
              "with the GPUs (`--gpus all`)"),
    NvmlError(18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "system",
              "the NVIDIA kernel module and libnvidia-ml.so.1 are of different driver "
              "versions (Driver/library version mismatch)",
              "reboot (the driver was upgraded without one), or reload the modules: `sudo "
              "rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`"),
    NvmlError(19, "NVML_ERROR_IN_USE", "query",
              "the operation needs the GPU idle and a process uses it", FIX_QUERY),
    NvmlError(20, "NVML_ERROR_MEMORY", "device",
              "the driver ran out of memory answering for this GPU",
              "free host memory or reboot; `sudo dmesg | grep -i nvrm` shows the error"),
    NvmlError(21, "NVML_ERROR_NO_DATA", "query", "NVML has no data for this field yet",
              FIX_QUERY),
    NvmlError(22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", "query",
              "ECC is not supported on this vGPU", FIX_QUERY),
    NvmlError(23, "NVML_ERROR_INSUFFICIENT_RESOURCES", "device",
              "the driver has not enough resources for this GPU (too many processes or "
              "contexts)", "`nvidia-smi` lists the processes using it: stop them, or choose "
              "other GPUs with GPUS="),
    NvmlError(24, "NVML_ERROR_FREQ_NOT_SUPPORTED", "query",
              "the clock frequency asked for is not supported", FIX_QUERY),
    NvmlError(25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "query",
              "nvidia-ml-py asked with a structure version this driver does not know "
              "(nvidia-ml-py newer than the driver)", FIX_DRIVER_UPGRADE_NVML),
    NvmlError(26, "NVML_ERROR_DEPRECATED", "query",
              "the driver no longer answers this deprecated function", FIX_QUERY),
    NvmlError(27, "NVML_ERROR_NOT_READY", "device",
              "the GPU is not ready yet (initialising, or the fabric manager has not "
              "registered it on an NVSwitch machine)",
              "wait and run `mgpu doctor` again; on NVSwitch machines: `sudo systemctl enable "
              "--now nvidia-fabricmanager`"),
    NvmlError(28, "NVML_ERROR_GPU_NOT_FOUND", "device",
              "the GPU was not found (removed, or hidden since NVML listed it)", FIX_LOST),
    NvmlError(29, "NVML_ERROR_INVALID_STATE", "device",
              "the GPU is in a state that does not allow the operation (being reset, drained)",
              FIX_RESET),
    NvmlError(30, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", "query",
              "this GPU does not support the reset type asked for", FIX_QUERY),
    NvmlError(999, "NVML_ERROR_UNKNOWN", "system",
              "NVML failed with an unknown error (in a container: it lost its GPUs; on a "
              "host: the driver is in a bad state)",
              "`sudo dmesg | grep -i nvrm` shows the driver's error; reboot if `nvidia-smi` "
              "fails too"),
)}


def describe(code: int) -> NvmlError:
    """The table's entry for `code`; a code newer than this table gets an answer that
    names it (and counts as device-level: the GPU is not trusted)."""
    return ERRORS.get(code, NvmlError(
        code, f"nvmlReturn {code}", "device", f"NVML failed with return code {code}",
        "see nvml.h's nvmlReturn_t for the code; `nvidia-smi` and `sudo dmesg | grep -i nvrm`"))


def code_of(error: BaseException) -> int | None:
    """The NVML return code an nvidia-ml-py `NVMLError` carries (its `value`); None for any
    other exception."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_query_only(code: int | None) -> bool:
    """Whether `code` only means one field has no answer (the GPU stays usable)."""
    return code is not None and describe(code).scope == "query"
