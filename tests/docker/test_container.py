"""The container, end to end: `make test-container` (docker/test-container.sh).

Builds a CPU base image and the project's image on it (with the GPU image's CUDA
wheels), checks the CUDA stack in it (every library TensorFlow opens for the GPU loads
from where TensorFlow looks, cuDNN/NCCL/ptxas at the pins, libdevice where XLA looks) and
`mgpu doctor --json`, runs doctor and train through compose, stops a run with
`docker stop` and checks that the next one resumes, and validates the GPU compose file.
Needs a Docker engine; the first build downloads ~2.5 GB of wheels and takes minutes (the
base image, the layers and uv's download cache are kept).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.children import REPO as ROOT
from tests.support.docker import docker_engine_missing


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.xdist_group("docker")  # one worker builds the image the docker tests share
@pytest.mark.timeout(3600)
def test_make_test_container(tmp_path: Path) -> None:
    reason = docker_engine_missing()
    if reason:
        pytest.skip(reason)
    log = tmp_path / "test-container.log"
    with log.open("w") as out:
        result = subprocess.run(
            ["make", "--no-print-directory", "test-container"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3500,
            check=False,
        )
    output = log.read_text()
    assert result.returncode == 0, f"make test-container failed:\n{output[-6000:]}"
    assert "container check passed" in output
