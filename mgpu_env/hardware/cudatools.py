"""The CUDA tools XLA runs for the GPU, found the way XLA finds them.

The CUDA tools XLA runs for the GPU, `ptxas` and libdevice, found the way XLA finds them, and
where TensorFlow and NVIDIA's wheels live (what `cudalibs` searches too)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

LIBDEVICE = "libdevice.10.bc"
# XLA skips a ptxas older than 11.8 and the buggy 12.3.103 (FindPtxAsExecutable in
# xla/stream_executor/cuda/subprocess_compilation.cc).
PTXAS_MINIMUM = (11, 8, 0)
PTXAS_EXCLUDED = ((12, 3, 103),)


@dataclass(frozen=True)
class CudaTool:
    """A CUDA command-line tool (ptxas) XLA would run, and its version."""

    path: str
    version: str  # "12.5.82"


def tensorflow_dir() -> Path:
    """The folder of TensorFlow's shared objects (site-packages/tensorflow), not imported."""
    try:
        found = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        found = None
    if found is not None and found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations)))
    return Path(sysconfig.get_paths()["platlib"]) / "tensorflow"


def wheel_root() -> Path:
    """site-packages/nvidia next to TensorFlow: `$ORIGIN/../nvidia` from its libraries."""
    return tensorflow_dir().parent / "nvidia"


def xla_cuda_data_dir(environ: Mapping[str, str]) -> str | None:
    """The folder `XLA_FLAGS=--xla_gpu_cuda_data_dir=...` names, or None."""
    match = re.search(r"--xla_gpu_cuda_data_dir=(\S+)", environ.get("XLA_FLAGS", ""))
    return match.group(1).strip("'\"") if match else None


def cuda_roots(environ: Mapping[str, str], tf_dir: Path | None = None) -> list[Path]:
    """XLA's candidate CUDA roots, in its order (CandidateCudaRoots in
    xla/tsl/platform/default/cuda_root_path.cc): the XLA_FLAGS folder, /usr/local/cuda,
    /opt/cuda, then beside TensorFlow's libraries `../nvidia/cuda_nvcc` (the
    nvidia-cuda-nvcc-cu12 wheel) and `cuda`, then a conda environment's prefix."""
    tf_dir = tensorflow_dir() if tf_dir is None else tf_dir
    roots = []
    preferred = xla_cuda_data_dir(environ)
    if preferred:
        roots.append(Path(preferred))
    roots += [Path("/usr/local/cuda"), Path("/opt/cuda")]
    roots += [tf_dir.parent / "nvidia" / "cuda_nvcc", tf_dir / "cuda"]
    roots += [tf_dir.parents[index] for index in (3,) if len(tf_dir.parents) > index]
    return roots


def ptxas_candidates(environ: Mapping[str, str], tf_dir: Path | None = None) -> list[Path]:
    """Where XLA looks for ptxas, in its order (FindCudaExecutable in
    xla/stream_executor/cuda/subprocess_compilation.cc): `<XLA_FLAGS folder>/bin`, every
    PATH folder (PreferPtxasFromPath() is true), then `<root>/bin` for the CUDA roots."""
    candidates = []
    preferred = xla_cuda_data_dir(environ)
    if preferred:
        candidates.append(Path(preferred, "bin", "ptxas"))
    candidates += [Path(d, "ptxas") for d in environ.get("PATH", "").split(":") if d]
    candidates += [root / "bin" / "ptxas" for root in cuda_roots(environ, tf_dir)]
    unique: list[Path] = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def run_tool_version(path: str) -> str:
    """`<tool> --version`'s output. Raises OSError/CalledProcessError/TimeoutExpired."""
    done = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def parse_tool_version(text: str) -> tuple[int, int, int]:
    """'Cuda compilation tools, release 12.5, V12.5.82' -> (12, 5, 82)."""
    match = re.search(r"V(\d+)\.(\d+)\.(\d+)", text) or re.search(
        r"release (\d+)\.(\d+)()", text
    )
    if not match:
        raise ValueError(f"no version in {text.strip()[:80]!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def find_ptxas(environ: Mapping[str, str], tf_dir: Path | None = None) -> CudaTool:
    """The ptxas XLA would run, as XLA chooses it. Raises RuntimeError naming where it
    looked."""
    skipped = []
    candidates = ptxas_candidates(environ, tf_dir)
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            version = parse_tool_version(run_tool_version(str(candidate)))
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            skipped.append(f"{candidate} (does not run: {err})")
            continue
        text = ".".join(str(v) for v in version)
        if version < PTXAS_MINIMUM or version in PTXAS_EXCLUDED:
            skipped.append(f"{candidate} ({text}, which XLA does not use)")
            continue
        return CudaTool(str(candidate), text)
    roots = ", ".join(str(root / "bin") for root in cuda_roots(environ, tf_dir))
    raise RuntimeError(
        "no usable ptxas (" + ("; ".join(skipped) + "; " if skipped else "")
        + f"looked in XLA's order: PATH, then {roots})"
    )


def libdevice_candidates(environ: Mapping[str, str], tf_dir: Path | None = None) -> list[Path]:
    """XLA takes the first `<root>/nvvm/libdevice` folder that exists (GetLibdeviceDir in
    xla/service/gpu/llvm_gpu_backend/nvptx_backend.cc) and reads libdevice.10.bc there."""
    return [root / "nvvm" / "libdevice" for root in cuda_roots(environ, tf_dir)]


def find_libdevice(environ: Mapping[str, str], tf_dir: Path | None = None) -> str:
    """The libdevice.10.bc XLA would read. Raises RuntimeError naming where it looked."""
    folders = libdevice_candidates(environ, tf_dir)
    for folder in folders:
        if folder.is_dir():
            bitcode = folder / LIBDEVICE
            if bitcode.is_file():
                return str(bitcode)
            raise RuntimeError(f"XLA picks {folder}, which has no {LIBDEVICE}")
    raise RuntimeError(
        "no nvvm/libdevice folder (looked in XLA's order: "
        + ", ".join(str(f) for f in folders) + ")"
    )
