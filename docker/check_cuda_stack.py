"""Check the CUDA user space that requirements-cuda.lock installs, where TensorFlow looks.

No GPU needed: every library TensorFlow 2.21 opens for the GPU is loaded with ctypes from
the wheel folder TensorFlow's own search path names, the versions the libraries report
are compared with the pins, and XLA's ptxas and libdevice are found the way XLA finds them.
libcuda.so.1 is the driver's (mounted by the NVIDIA Container Toolkit), so it is not here.

The Dockerfile runs it after installing the locks (a wrong or missing wheel fails the
build) and docker/test-container.sh runs it in the built image. Standard library only.

Where TensorFlow 2.21 looks (read from the installed wheel, `readelf -d`):
- libtensorflow_framework.so.2, which holds TSL's DSO loader that dlopen()s the CUDA
  libraries, has a DT_RUNPATH of `$ORIGIN/../nvidia/<package>/lib` for cublas, cuda_cupti,
  cuda_runtime, cudnn, cufft, cusparse and nccl; libtensorflow_cc.so.2 adds cusolver.
  dlopen() searches the calling object's DT_RUNPATH (man 3 dlopen).
- nvJitLink is opened by cuSPARSE, cuSOLVER and cuFFT through their own RUNPATH
  `$ORIGIN/../../nvjitlink/lib`.
- XLA's CUDA roots include `<dir of the TF library>/../nvidia/cuda_nvcc`, where it takes
  `bin/ptxas` and `nvvm/libdevice/libdevice.10.bc` (CandidateCudaRoots in
  https://github.com/openxla/xla/blob/main/xla/tsl/platform/default/cuda_root_path.cc and
  xla/service/gpu/llvm_gpu_backend/nvptx_libdevice_path.cc); ptxas on PATH comes first.

Usage: check_cuda_stack.py --cuda 12.5.1 --cudnn 9.3.0.75 --nccl 2.27.7
Prints one line per check; exits 1 when any fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CudaLibrary:
    """One library TensorFlow opens for the GPU, and the wheel folder it comes from."""

    name: str
    package: str  # the folder under site-packages/nvidia/
    soname: str
    # The library whose RUNPATH names the folder: a TF library (relative to the tensorflow
    # package) or an NVIDIA one (relative to site-packages/nvidia).
    found_through: str
    runpath_entry: str


_TF_FRAMEWORK = "tensorflow/libtensorflow_framework.so.2"
_TF_CC = "tensorflow/libtensorflow_cc.so.2"

# Load order: each library's dependencies first (ctypes loads with RTLD_GLOBAL, so the
# next one's DT_NEEDED are already satisfied by soname).
LIBRARIES: tuple[CudaLibrary, ...] = (
    CudaLibrary("cudart", "cuda_runtime", "libcudart.so.12", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/cuda_runtime/lib"),
    CudaLibrary("nvjitlink", "nvjitlink", "libnvJitLink.so.12",
                "nvidia/cusparse/lib/libcusparse.so.12", "$ORIGIN/../../nvjitlink/lib"),
    CudaLibrary("cublasLt", "cublas", "libcublasLt.so.12", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/cublas/lib"),
    CudaLibrary("cublas", "cublas", "libcublas.so.12", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/cublas/lib"),
    CudaLibrary("cufft", "cufft", "libcufft.so.11", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/cufft/lib"),
    CudaLibrary("curand", "curand", "libcurand.so.10", "", ""),
    CudaLibrary("cusparse", "cusparse", "libcusparse.so.12", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/cusparse/lib"),
    CudaLibrary("cusolver", "cusolver", "libcusolver.so.11", _TF_CC,
                "$ORIGIN/../nvidia/cusolver/lib"),
    CudaLibrary("cudnn", "cudnn", "libcudnn.so.9", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/cudnn/lib"),
    CudaLibrary("nccl", "nccl", "libnccl.so.2", _TF_FRAMEWORK,
                "$ORIGIN/../nvidia/nccl/lib"),
)


@dataclass(frozen=True)
class Result:
    """One check: its name, whether it passed, and what was found (or what is wrong)."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def site_packages() -> Path:
    """The folder TensorFlow is installed in; TensorFlow's search paths are relative to it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        raise SystemExit("error: tensorflow is not installed in this Python")
    return Path(spec.origin).resolve().parent.parent


def version_code(text: str, parts: int) -> int:
    """'9.3.0.75' -> 90300 (cuDNN 9, NCCL >= 2.9 and CUDA encode major*10000+minor*100+patch)."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:parts]]
    numbers += [0] * (3 - len(numbers))
    return numbers[0] * 10000 + numbers[1] * 100 + numbers[2]


def decode(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def check_runpath(root: Path, library: CudaLibrary) -> Result:
    name = f"{library.name} search path"
    if not library.found_through:
        return Result(name, True, f"nvidia/{library.package}/lib (no TF RUNPATH names it)")
    base = root / "nvidia" / library.found_through.removeprefix("nvidia/")
    if library.found_through.startswith("tensorflow/"):
        base = root / library.found_through
    try:
        named = library.runpath_entry.encode() in base.read_bytes()
    except OSError as error:
        return Result(name, False, f"cannot read {base}: {error.strerror}")
    if not named:
        return Result(name, False, f"{base.name} does not name {library.runpath_entry}")
    return Result(name, True, f"{library.runpath_entry} in {base.name}")


def load_library(root: Path, library: CudaLibrary) -> tuple[Result, ctypes.CDLL | None]:
    path = root / "nvidia" / library.package / "lib" / library.soname
    name = f"{library.name} loads"
    if not path.is_file():
        return Result(name, False, f"no {path}: install requirements-cuda.lock"), None
    try:
        handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        return Result(name, False, f"{path}: {error}"), None
    return Result(name, True, str(path)), handle


def reported_version(handle: ctypes.CDLL, library: str) -> int:
    """The version a loaded library reports about itself (no GPU needed)."""
    if library == "cudnn":
        handle.cudnnGetVersion.restype = ctypes.c_size_t
        return int(handle.cudnnGetVersion())
    out = ctypes.c_int(0)
    function = {"cudart": "cudaRuntimeGetVersion", "nccl": "ncclGetVersion"}[library]
    status = getattr(handle, function)(ctypes.byref(out))
    if status != 0:
        raise OSError(f"{function} returned {status}")
    if library == "cudart":  # 12050 = 12.5
        return out.value // 1000 * 10000 + out.value % 1000 // 10 * 100
    return out.value


def check_version(handle: ctypes.CDLL, library: str, pinned: str, parts: int) -> Result:
    name = f"{library} version"
    try:
        found = reported_version(handle, library)
    except (OSError, AttributeError) as error:
        return Result(name, False, f"could not ask the library: {error}")
    expected = version_code(pinned, parts)
    if found // 10 ** (2 * (3 - parts)) != expected // 10 ** (2 * (3 - parts)):
        return Result(name, False, f"found {decode(found)}, expected {pinned} (the pin)")
    return Result(name, True, f"{decode(found)} (pinned {pinned})")


def check_distribution(package: str, pinned: str) -> Result:
    name = f"{package} wheel"
    try:
        found = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return Result(name, False, f"not installed, expected {pinned} (requirements-cuda.lock)")
    if not (found == pinned or found.startswith(pinned + ".")):
        return Result(name, False, f"found {found}, expected {pinned}")
    return Result(name, True, found)


def check_ptxas(root: Path, cuda: str) -> Result:
    ptxas = root / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    try:
        out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return Result("ptxas", False, f"{ptxas} --version fails: {error}")
    release = re.search(r"release (\d+\.\d+)", out)
    expected = ".".join(cuda.split(".")[:2])
    if not release or release[1] != expected:
        found = release[1] if release else out.strip()[-80:]
        return Result("ptxas", False, f"{ptxas} is release {found}, expected {expected}")
    return Result("ptxas", True, f"{ptxas}: release {release[1]}")


def check_libdevice(root: Path) -> Result:
    nvcc_root = root / "nvidia" / "cuda_nvcc"
    libdevice = nvcc_root / "nvvm" / "libdevice" / "libdevice.10.bc"
    if not libdevice.is_file():
        return Result("libdevice", False, f"no {libdevice}; XLA=1 cannot compile on a GPU")
    try:
        named = b"../nvidia/cuda_nvcc" in (root / _TF_CC).read_bytes()
    except OSError as error:
        return Result("libdevice", False, f"cannot read {root / _TF_CC}: {error.strerror}")
    if not named:
        return Result("libdevice", False, f"{_TF_CC} does not search ../nvidia/cuda_nvcc")
    return Result("libdevice", True, f"{libdevice} (XLA root ../nvidia/cuda_nvcc)")


def check_stack(cuda: str, cudnn: str, nccl: str) -> list[Result]:
    """Every check, in order; the caller prints them."""
    root = site_packages()
    results = [
        check_distribution("nvidia-cuda-runtime-cu12", ".".join(cuda.split(".")[:2])),
        check_distribution("nvidia-cudnn-cu12", cudnn),
        check_distribution("nvidia-nccl-cu12", nccl),
    ]
    handles: dict[str, ctypes.CDLL] = {}
    for library in LIBRARIES:
        results.append(check_runpath(root, library))
        result, handle = load_library(root, library)
        results.append(result)
        if handle is not None:
            handles[library.name] = handle
    pins = {"cudart": (cuda, 2), "cudnn": (cudnn, 3), "nccl": (nccl, 3)}
    for name, (pinned, parts) in pins.items():
        if name in handles:
            results.append(check_version(handles[name], name, pinned, parts))
    results += [check_ptxas(root, cuda), check_libdevice(root)]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", required=True, help="pinned CUDA, e.g. 12.5.1")
    parser.add_argument("--cudnn", required=True, help="pinned cuDNN, e.g. 9.3.0.75")
    parser.add_argument("--nccl", required=True, help="pinned NCCL, e.g. 2.27.7")
    args = parser.parse_args(argv)
    for flag, value in vars(args).items():
        if not re.fullmatch(r"\d+(\.\d+){1,3}", value):
            parser.error(f"--{flag} must be a version like 12.5.1; got {value!r}")
    results = check_stack(args.cuda, args.cudnn, args.nccl)
    for result in results:
        print(result.line(), file=sys.stdout if result.ok else sys.stderr)
    failed = [r.name for r in results if not r.ok]
    if failed:
        print(f"CUDA stack check failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"CUDA stack ok: CUDA {args.cuda}, cuDNN {args.cudnn}, NCCL {args.nccl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
