"""The one compatibility table: which CUDA, cuDNN, Python and driver go with which TensorFlow.

`mgpu doctor` judges the machine against it, and the container's test checks the
Dockerfile's pins against it (`pinned()`). Change a pin here first, then in the Dockerfile.

Sources:
- TensorFlow -> CUDA, cuDNN, Python: https://www.tensorflow.org/install/source#gpu
  ("Tested build configurations"); for 2.21 also the wheel's own metadata
  (`Requires-Python: >=3.10`, `tensorflow[and-cuda]` pins nvidia-cudnn-cu12>=9.3.0.75 and
  CUDA 12.5 components) and `tf.sysconfig.get_build_info()` (cuda_version 12.5.1).
- CUDA toolkit -> minimum Linux x86_64 driver: the CUDA Toolkit Release Notes, table
  "CUDA Toolkit and Corresponding Driver Versions"
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html). That driver runs
  every feature of the toolkit.
- Minor-version compatibility: https://docs.nvidia.com/deploy/cuda-compatibility/ — an
  application built with any CUDA 12.x runs on a driver >= 525.60.13 (11.x: >= 450.80.02),
  with a limited feature set (no PTX newer than the driver, so GPUs only covered by PTX
  cannot run).
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
    "12.5": "555.42.02",
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
        TfBuild("2.21", cuda="12.5", cudnn="9.3", python_min="3.10", python_max="3.13"),
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


def min_driver_for_cuda(cuda: str) -> str | None:
    """The full-feature minimum Linux driver for a CUDA version ('12.5' or '12.5.1')."""
    try:
        return CUDA_MIN_DRIVER_LINUX.get(minor_of(cuda))
    except ValueError:
        return None


def driver_at_least(driver: str, minimum: str) -> bool:
    """Compare NVIDIA driver versions numerically ('555.42.02' >= '525.60.13')."""
    return version_tuple(driver) >= version_tuple(minimum)


def cuda_from_nvml(encoded: int) -> str:
    """NVML's CUDA driver version (12040) as text ('12.4')."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"
