"""The one compatibility table for TensorFlow's CUDA, drivers, Python and GPUs.

The one compatibility table: which CUDA, cuDNN, NCCL, Python and driver go with which
TensorFlow, and which GPUs its wheel has machine code for.

`mgpu doctor` judges the machine against it, and the container's test checks the
Dockerfile's pins against it (`pinned()`). Change a pin here first, then in the Dockerfile.

Sources, row by row:
- TensorFlow -> CUDA, cuDNN, Python: https://www.tensorflow.org/install/source#gpu
  ("Tested build configurations", Linux GPU): 2.18.0 3.9-3.12 cuDNN 9.3 CUDA 12.5;
  2.17.0 and 2.16.1 3.9-3.12 cuDNN 8.9 CUDA 12.3; 2.15.0 3.9-3.11 cuDNN 8.9 CUDA 12.2;
  2.14.0 3.9-3.11 cuDNN 8.7 CUDA 11.8. That table stops at 2.18; 2.19-2.21 come from the
  wheels themselves: `Requires-Python` (2.21: >=3.10), the `and-cuda` extra (2.21:
  nvidia-cudnn-cu12>=9.3.0.75, nvidia-nccl-cu12>=2.27.7, CUDA 12.5 components >=12.5.82)
  and `tf.sysconfig.get_build_info()` (2.21: cuda_version 12.5.1, cudnn_version 9).
- CUDA toolkit -> minimum Linux x86_64 driver: the CUDA Toolkit Release Notes, table 3
  "CUDA Toolkit and Corresponding Driver Versions"
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html), for the release a
  build is made with: 12.5 Update 1 (12.5.1, what TensorFlow 2.18-2.21 and the image use)
  needs >= 555.42.06 (12.5 GA: 555.42.02). That driver runs every feature of the toolkit.
- Minor-version compatibility: https://docs.nvidia.com/deploy/cuda-compatibility/ — an
  application built with any CUDA 12.x runs on a driver >= 525.60.13 (11.x: >= 450.80.02),
  with a limited feature set (no PTX newer than the driver, so GPUs only covered by PTX
  cannot run). On bare metal only: NVIDIA's CUDA images set NVIDIA_REQUIRE_CUDA
  ("cuda>=12.5 brand=tesla,driver>=470,driver<471 ..."), and the NVIDIA Container Toolkit
  refuses to start them on a driver older than the image's CUDA unless it belongs to one of
  the data-centre branches listed there.
- Machine code in the wheel: `get_build_info()` of 2.21 lists sm_60, sm_70, sm_80, sm_89
  and compute_90, but the wheel's fatbinaries (libtensorflow_cc.so.2, counted by their
  headers) also carry sm_90 cubins of about the size of every other architecture's
  (47 MB next to 46 MB for sm_89): H100/H200 run machine code, with no PTX compilation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The TensorFlow minor version requirements.lock pins; the Dockerfile must agree with it.
PINNED_TENSORFLOW = "2.21"

# CUDA toolkit (major.minor, the GA release) -> minimum Linux x86_64 driver for every feature.
CUDA_MIN_DRIVER_LINUX: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.06",  # 12.5 Update 1; TensorFlow 2.18-2.21 are built with 12.5.1
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

# CUDA major version -> the oldest driver that runs it under minor-version compatibility.
MINOR_VERSION_COMPAT_MIN_DRIVER_LINUX: dict[int, str] = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}


@dataclass(frozen=True)
class TfBuild:
    """What one TensorFlow minor release was built and tested with (Linux GPU wheel)."""

    tensorflow: str  # "2.21"
    cuda: str  # "12.5": toolkit major.minor
    cudnn: str  # "9.3": major.minor
    python_min: str  # "3.10": oldest supported Python, inclusive
    python_max: str  # "3.13": newest supported Python, inclusive
    # The oldest NCCL its `and-cuda` extra accepts (None: not recorded for this row).
    nccl_min: str | None = None
    # GPU machine code the wheel carries beyond what get_build_info() lists ("sm_90").
    extra_machine_code: tuple[str, ...] = ()

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def python_range(self) -> str:
        return f"{self.python_min}-{self.python_max}"

    @property
    def min_driver_linux(self) -> str:
        """The driver that runs every feature of this build's CUDA toolkit."""
        return CUDA_MIN_DRIVER_LINUX[self.cuda]

    @property
    def min_driver_linux_minor_compat(self) -> str:
        """The oldest driver that runs this build at all (CUDA minor-version compatibility)."""
        return MINOR_VERSION_COMPAT_MIN_DRIVER_LINUX[self.cuda_major]

    def supports_python(self, version: str) -> bool:
        """Whether Python `version` ("3.12" or "3.12.3") is in this build's range."""
        return (
            version_tuple(self.python_min)
            <= version_tuple(version)[:2]
            <= version_tuple(self.python_max)
        )


COMPAT: dict[str, TfBuild] = {
    build.tensorflow: build
    for build in (
        TfBuild("2.21", cuda="12.5", cudnn="9.3", python_min="3.10", python_max="3.13",
                nccl_min="2.27.7", extra_machine_code=("sm_90",)),
        TfBuild("2.20", cuda="12.5", cudnn="9.3", python_min="3.9", python_max="3.13"),
        TfBuild("2.19", cuda="12.5", cudnn="9.3", python_min="3.9", python_max="3.12"),
        TfBuild("2.18", cuda="12.5", cudnn="9.3", python_min="3.9", python_max="3.12"),
        TfBuild("2.17", cuda="12.3", cudnn="8.9", python_min="3.9", python_max="3.12"),
        TfBuild("2.16", cuda="12.3", cudnn="8.9", python_min="3.9", python_max="3.12"),
        TfBuild("2.15", cuda="12.2", cudnn="8.9", python_min="3.9", python_max="3.11"),
        TfBuild("2.14", cuda="11.8", cudnn="8.7", python_min="3.9", python_max="3.11"),
    )
}


def version_tuple(text: str) -> tuple[int, ...]:
    """'555.42.02' -> (555, 42, 2); '2.21.0rc1' -> (2, 21, 0). Raises ValueError if no digits."""
    parts = []
    for piece in text.strip().split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
    if not parts:
        raise ValueError(f"{text!r} is not a version")
    return tuple(parts)


def minor_of(version: str) -> str:
    """'2.21.0' -> '2.21'."""
    return ".".join(str(p) for p in version_tuple(version)[:2])


def for_tensorflow(version: str) -> TfBuild | None:
    """The table's row for a TensorFlow version ('2.21', '2.21.0', '2.21.0rc1'), or None."""
    try:
        return COMPAT.get(minor_of(version))
    except ValueError:
        return None


def pinned() -> TfBuild:
    """The row for the TensorFlow that requirements.lock pins (what the image ships)."""
    return COMPAT[PINNED_TENSORFLOW]


def driver_at_least(driver: str, minimum: str) -> bool:
    """Compare NVIDIA driver versions numerically ('555.42.02' >= '525.60.13')."""
    return version_tuple(driver) >= version_tuple(minimum)


def cuda_from_nvml(encoded: int) -> str:
    """NVML's CUDA driver version (12040) as text ('12.4')."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def build_capabilities(tensorflow: str | None, reported: tuple[str, ...]) -> tuple[str, ...]:
    """What a TensorFlow build really has code for: what it reports, plus the machine code
    its wheel is known to carry besides (the table's `extra_machine_code`)."""
    row = for_tensorflow(tensorflow) if tensorflow else None
    extra = tuple(c for c in (row.extra_machine_code if row else ()) if c not in reported)
    return reported + extra if reported else reported
