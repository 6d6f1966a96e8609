"""The lock files: hashes on every pin, the CUDA pins TensorFlow's wheel asks for, and
installers that refuse a wheel whose hash does not match.

No network: the tamper test builds a tiny wheel of its own and installs it from a folder.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from mgpu_env.hardware import compat
from tests.support.children import REPO as ROOT

LOCKS = (
    "requirements.lock",
    "requirements-dev.lock",
    "requirements-cuda.lock",
    "requirements-uv.lock",
)


def lock_entries(name: str) -> dict[str, tuple[str, list[str]]]:
    """{package: (version, [sha256...])} from a `uv pip compile --generate-hashes` file."""
    text = (ROOT / name).read_text().replace("\\\n", " ")
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
        assert match, f"{name}: not an exact pin: {line[:80]}"
        entries[match[1].lower()] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return entries


def locked_versions(name: str) -> dict[str, str]:
    return {package: version for package, (version, _) in lock_entries(name).items()}


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match[1]


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_carries_hashes(lock: str) -> None:
    entries = lock_entries(lock)
    assert entries, f"{lock} pins nothing"
    unhashed = [name for name, (_, hashes) in entries.items() if not hashes]
    assert not unhashed, f"{lock}: no --hash for {unhashed}; run `make locks`"


def test_dev_lock_agrees_with_runtime_lock() -> None:
    runtime = lock_entries("requirements.lock")
    dev = lock_entries("requirements-dev.lock")
    differing = {n: (v, dev[n][0]) for n, (v, _) in runtime.items() if dev.get(n, (v,))[0] != v}
    assert not differing, f"requirements-dev.lock pins other versions: {differing}"
    missing = sorted(set(runtime) - set(dev))
    assert not missing, f"requirements-dev.lock lacks {missing}"


def test_cuda_lock_pins_exactly_what_tensorflow_was_built_with() -> None:
    """Each `and-cuda` requirement of the installed TensorFlow, pinned at its lower bound."""
    try:
        requires = importlib.metadata.requires("tensorflow") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tensorflow is not installed")
    wanted = {}
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker and requirement.marker.evaluate({"extra": "and-cuda"}) and (
            not requirement.marker.evaluate({"extra": ""})
        ):
            lower = [s.version for s in requirement.specifier if s.operator == ">="]
            assert lower, f"no lower bound in {text}"
            wanted[requirement.name.lower()] = lower[0]
    assert wanted, "the installed tensorflow has no and-cuda extra"
    locked = locked_versions("requirements-cuda.lock")
    assert locked == wanted, "requirements-cuda.lock differs from tensorflow[and-cuda]'s minimums"


def test_cuda_lock_agrees_with_dockerfile_and_table() -> None:
    locked = locked_versions("requirements-cuda.lock")
    cuda = dockerfile_arg("PINNED_CUDA_VERSION")
    assert compat.minor_of(locked["nvidia-cuda-runtime-cu12"]) == compat.minor_of(cuda)
    assert compat.minor_of(locked["nvidia-cuda-nvcc-cu12"]) == compat.minor_of(cuda)
    assert locked["nvidia-cudnn-cu12"] == dockerfile_arg("PINNED_CUDNN_VERSION")
    assert locked["nvidia-nccl-cu12"] == dockerfile_arg("PINNED_NCCL_VERSION")
    assert compat.minor_of(locked["nvidia-cudnn-cu12"]) == compat.pinned().cudnn
    assert compat.minor_of(cuda) == compat.pinned().cuda


def test_cuda_lock_is_compiled_from_its_input() -> None:
    pins = {}
    for line in (ROOT / "requirements-cuda.in").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.lower()] = version
    locked = locked_versions("requirements-cuda.lock")
    assert pins == locked, "requirements-cuda.lock is stale: run `make locks`"


def test_uv_lock_pins_uv_alone() -> None:
    assert list(lock_entries("requirements-uv.lock")) == ["uv"]
    assert "requirements-uv.lock" in (ROOT / "Makefile").read_text()


def test_every_install_requires_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"^\t.*(?:pip install|pip sync).*-r.*$|^\t.*pip sync.*$", makefile, re.M)
    assert installs, "no installs found in the Makefile"
    for line in installs:
        assert "--require-hashes" in line, f"Makefile installs without --require-hashes: {line}"
    script = (ROOT / "docker" / "install-locks.sh").read_text()
    assert script.count("--require-hashes") >= 2, "docker/install-locks.sh must require hashes"


def _wheel(folder: Path, payload: str) -> Path:
    """A minimal valid wheel, tamperdemo 1.0, whose module holds `payload`."""
    path = folder / "tamperdemo-1.0-py3-none-any.whl"
    files = {
        "tamperdemo.py": payload,
        "tamperdemo-1.0.dist-info/METADATA": (
            "Metadata-Version: 2.1\nName: tamperdemo\nVersion: 1.0\n"
        ),
        "tamperdemo-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append("tamperdemo-1.0.dist-info/RECORD,,")
    files["tamperdemo-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _uv() -> str | None:
    version = lock_entries("requirements-uv.lock")["uv"][0]
    local = ROOT / ".tools" / f"uv-{version}" / "bin" / "uv"
    return str(local) if local.exists() else shutil.which("uv")


def _installers(
    target: Path, wheels: Path, lock: Path, cache: Path
) -> dict[str, list[str] | None]:
    """The two installers with the flags the Makefile and the Dockerfile use, offline."""
    uv = _uv()
    return {
        "uv": [uv, "pip", "install", "--python", sys.executable, "--target", str(target),
               "--require-hashes", "--no-deps", "--no-index", "--find-links", str(wheels),
               "--cache-dir", str(cache), "-r", str(lock)] if uv else None,
        "pip": [sys.executable, "-m", "pip", "install", "--target", str(target),
                "--require-hashes", "--no-deps", "--no-index", "--find-links", str(wheels),
                "--no-cache-dir", "-r", str(lock)],
    }


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_tampered_wheel_fails_the_install(installer: str, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, "VALUE = 1\n")
    lock = tmp_path / "demo.lock"
    lock.write_text(f"tamperdemo==1.0 --hash=sha256:{sha256(wheel)}\n")

    command = _installers(tmp_path / "good", wheels, lock, tmp_path / "cache")[installer]
    if command is None:
        pytest.skip(f"{installer} is not installed (make venv installs uv into .tools/)")
    good = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert good.returncode == 0, good.stdout + good.stderr

    _wheel(wheels, "VALUE = 2  # swapped\n")
    # A machine that has not seen the good wheel (a fresh cache): the install stops.
    tampered = _installers(tmp_path / "bad", wheels, lock, tmp_path / "fresh-cache")[installer]
    assert tampered is not None
    bad = subprocess.run(tampered, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode != 0, "a wheel with another hash was installed"
    message = (bad.stdout + bad.stderr).lower()
    assert "hash" in message and ("mismatch" in message or "do not match" in message), message
    assert not (tmp_path / "bad" / "tamperdemo.py").exists()


def test_uv_cache_keeps_serving_the_verified_wheel(tmp_path: Path) -> None:
    """With the cache of a verified install, uv installs that content, not a swapped file."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, "VALUE = 1\n")
    lock = tmp_path / "demo.lock"
    lock.write_text(f"tamperdemo==1.0 --hash=sha256:{sha256(wheel)}\n")
    cache = tmp_path / "cache"
    if _installers(tmp_path / "a", wheels, lock, cache)["uv"] is None:
        pytest.skip("uv is not installed (make venv installs uv into .tools/)")
    for target in ("a", "b"):
        command = _installers(tmp_path / target, wheels, lock, cache)["uv"]
        assert command is not None
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert (tmp_path / target / "tamperdemo.py").read_text() == "VALUE = 1\n"
        _wheel(wheels, "VALUE = 2  # swapped\n")
