"""Real fake NVIDIA libraries, built with gcc at test time, found by the real dynamic loader.

- `build_libcuda`: a `libcuda.so.1` (soname and all) whose cuInit, cuDriverGetVersion and
  cuDeviceGetCount answer with the codes it is built with.
- `build_library`: one CUDA library (cudart, cuDNN, NCCL, cuSPARSE, nvJitLink, ...) with its
  soname and version function.
- `build_site`: a site-packages folder as `tensorflow[and-cuda]` lays it out: a stand-in
  `tensorflow` package (tests/fixtures/standin_tensorflow) whose own shared object dlopens
  the CUDA libraries by soname with, or without, TensorFlow's RUNPATH into
  `nvidia/<package>/lib`, and the NVIDIA wheels' folders with fake libraries in them.

Put the site on PYTHONPATH and folders on LD_LIBRARY_PATH in the environment the doctor's
children get: `cudadriver`, `cudalibs` and `tfprobe` then meet exactly what a user's machine
would give them. Every build goes to a fresh folder the caller owns (a tmp_path).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from mgpu_env.hardware import cudalibs

FIXTURES = Path(__file__).parents[1] / "fixtures"
SOURCES = FIXTURES / "fakecuda"
STANDIN = FIXTURES / "standin_tensorflow" / "tensorflow"
GCC = shutil.which("gcc") or shutil.which("cc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="no C compiler (gcc) on this machine")

# The versions the CUDA lock installs (what TensorFlow 2.21 is built against).
VERSIONS = {"cudart": 12050, "cudnn": 90300, "nccl": 22707}
DEFINE = {"cudart": "CUDART_VERSION", "cudnn": "CUDNN_VERSION", "nccl": "NCCL_VERSION"}


def _gcc(args: list[str]) -> None:
    assert GCC is not None, "no C compiler"
    done = subprocess.run([GCC, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gcc {' '.join(args)} failed: {done.stderr}")


def build_libcuda(
    folder: Path, *, init_code: int = 0, driver_version: int = 12050, device_count: int = 1,
    hang_s: int = 0,
) -> Path:
    """`folder/libcuda.so.1` answering cuInit with `init_code` (after `hang_s` seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "libcuda.so.1"
    _gcc(["-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1",
          f"-DINIT_CODE={init_code}", f"-DDRIVER_VERSION={driver_version}",
          f"-DDEVICE_COUNT={device_count}", *([f"-DINIT_SLEEP={hang_s}"] if hang_s else []),
          "-o", str(target), str(SOURCES / "libcuda.c")])
    return target


def build_library(
    folder: Path, soname: str, *, defines: Iterable[str] = (), link: Iterable[str] = (),
    runpath: str | None = None,
) -> Path:
    """`folder/<soname>`: a library with that soname and the given -D defines."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / soname
    args = ["-shared", "-fPIC", "-O0", f"-Wl,-soname,{soname}", "-o", str(target),
            str(SOURCES / "cudalib.c")]
    args += [f"-D{d}" for d in defines]
    if runpath:
        args += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
    args += list(link)
    _gcc(args)
    return target


def build_cuda_library(folder: Path, name: str, version: int | None = None) -> Path:
    """The fake of LIBRARIES entry `name` (cudnn, nccl, ...) in `folder`, with its version."""
    spec = cudalibs.spec(name)
    defines = []
    if name in DEFINE:
        defines.append(f"{DEFINE[name]}={version or VERSIONS[name]}")
    if name == "nvjitlink":
        defines.append("HAS_JITLINK_12_5")
    link: list[str] = []
    runpath = None
    if name in ("cusparse", "cusolver"):
        # cuSPARSE 12.5 needs nvJitLink 12.5's symbols; its wheel finds that wheel by RUNPATH.
        jitlink = folder.parent.parent / "nvjitlink" / "lib"
        if not (jitlink / "libnvJitLink.so.12").exists():
            build_cuda_library(jitlink, "nvjitlink")
        defines.append("NEEDS_JITLINK")
        link = [f"-L{jitlink}", "-l:libnvJitLink.so.12"]
        runpath = "$ORIGIN/../../nvjitlink/lib"
    return build_library(folder, spec.soname, defines=defines, link=link, runpath=runpath)


@dataclass(frozen=True)
class Site:
    """A site-packages folder with the stand-in TensorFlow and fake NVIDIA wheels."""

    root: Path

    @property
    def wheels(self) -> Path:
        return self.root / "nvidia"

    def wheel_lib(self, name: str) -> Path:
        return self.wheels / cudalibs.spec(name).package / "lib"

    def environ(self, base: Mapping[str, str], **extra: str) -> dict[str, str]:
        """`base` with this site first on PYTHONPATH (the stand-in `tensorflow` wins)."""
        env = dict(base)
        env["PYTHONPATH"] = str(self.root)
        env.update(extra)
        return env


def build_site(
    root: Path, *, runpath: bool = True, missing: Iterable[str] = (),
    versions: Mapping[str, int] | None = None, nvcc: bool = True, libdevice: bool = True,
    ptxas_version: str = "12.5.82",
) -> Site:
    """site-packages as `tensorflow[and-cuda]` installs it: the stand-in TensorFlow (with
    RUNPATH into the wheels unless `runpath` is false) and every CUDA wheel but `missing`;
    `nvcc`: the nvidia-cuda-nvcc wheel's ptxas (a script printing `ptxas_version`) and
    libdevice.10.bc."""
    site = Site(root)
    package = root / "tensorflow"
    shutil.copytree(STANDIN, package)
    rpath = ":".join(f"$ORIGIN/../nvidia/{spec.package}/lib" for spec in cudalibs.LIBRARIES)
    args = ["-shared", "-fPIC", "-O0", "-o", str(package / "libtensorflow_framework.so.2"),
            str(SOURCES / "loader.c"), "-ldl"]
    if runpath:
        args[3:3] = ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{rpath}"]
    _gcc(args)
    skip = set(missing)
    for spec in cudalibs.LIBRARIES:
        if spec.name not in skip:
            build_cuda_library(site.wheel_lib(spec.name), spec.name,
                               (versions or {}).get(spec.name))
    for name in skip:  # cuSPARSE's build makes the nvJitLink it links with: take it away
        library = site.wheel_lib(name) / cudalibs.spec(name).soname
        if library.exists():
            library.unlink()
    if nvcc:
        tools = site.wheels / "cuda_nvcc"
        (tools / "bin").mkdir(parents=True)
        ptxas = tools / "bin" / "ptxas"
        ptxas.write_text("#!/bin/sh\necho 'ptxas: NVIDIA (R) Ptx optimizing assembler'\n"
                         f"echo 'Cuda compilation tools, release {ptxas_version.rsplit('.', 1)[0]}"
                         f", V{ptxas_version}'\n")
        ptxas.chmod(0o755)
        if libdevice:
            (tools / "nvvm" / "libdevice").mkdir(parents=True)
            (tools / "nvvm" / "libdevice" / "libdevice.10.bc").write_bytes(b"BC\xc0\xde")
    return site
