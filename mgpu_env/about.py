"""What this installation is: mgpu's version, TensorFlow's, the image it runs in.

Read from package metadata and the environment only, so `mgpu --version` answers in
milliseconds and never imports TensorFlow.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

from mgpu_env import __version__

# The image's tag (e.g. mgpu-env:0.1.0), set by the Dockerfile (`ENV MGPU_IMAGE_TAG=...`,
# from a build argument); unset outside the image.
IMAGE_TAG_VARIABLE = "MGPU_IMAGE_TAG"


@dataclass(frozen=True)
class About:
    """Versions a bug report starts with. None: not installed, or not in the image."""

    mgpu: str
    tensorflow: str | None
    python: str
    image_tag: str | None

    def line(self) -> str:
        """One line: `mgpu 0.1.0, TensorFlow 2.21.0, Python 3.12.3, image mgpu-env:0.1.0`."""
        parts = [f"mgpu {self.mgpu}",
                 f"TensorFlow {self.tensorflow or 'not installed'}",
                 f"Python {self.python}"]
        if self.image_tag:
            parts.append(f"image {self.image_tag}")
        return ", ".join(parts)


def installed_version(distribution: str) -> str | None:
    """A distribution's installed version from its metadata (nothing is imported)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def about(environ: Mapping[str, str] | None = None) -> About:
    environ = os.environ if environ is None else environ
    return About(
        mgpu=__version__,
        tensorflow=installed_version("tensorflow"),
        python=platform.python_version(),
        image_tag=environ.get(IMAGE_TAG_VARIABLE, "").strip() or None,
    )
