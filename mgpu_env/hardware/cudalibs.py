"""The CUDA user space TensorFlow opens for the GPU: its libraries, `ptxas` and libdevice.

Each library is looked for where TensorFlow's own `dlopen` finds it, and loaded with
`ctypes`, so the doctor sees what training will see:

1. `LD_LIBRARY_PATH`: the dynamic loader searches it before a library's RUNPATH (ld.so(8)).
2. `site-packages/nvidia/<package>/lib` of this interpreter: TensorFlow's libraries carry
   RUNPATH `$ORIGIN/../nvidia/<package>/lib` (`readelf -d libtensorflow_framework.so.2`;
   `cuda_rpath_flags` in xla/tsl/platform/default/cuda_build_defs.bzl), which is where
   `tensorflow[and-cuda]`, and this project's CUDA lock, install the NVIDIA wheels.
3. The system loader: /etc/ld.so.cache and the default folders (a CUDA base image, a
   system-wide toolkit).

`ptxas` and `libdevice.10.bc` (XLA=1 compiles GPU code with them) are found the way XLA
finds them; see `ptxas_candidates` and `libdevice_candidates`.

Loading a library can crash the process on a broken install, so `mgpu doctor` runs
`collect_in_process` in a child (`collect`) and reads one JSON line back; `preflight`, in
the training process, calls `collect_in_process` directly. Every probe is a small
module-level function that tests replace; none raises: a failure is a `Probed` error that
says where it looked.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env.hardware import childprobe
from mgpu_env.hardware.cudatools import (
    CudaTool,
    find_libdevice,
    find_ptxas,
    wheel_root,
)
from mgpu_env.hardware.nvml import Probed, probe

JSON_MARKER = "MGPU_CUDALIBS_JSON "
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LibrarySpec:
    """One library TensorFlow opens for the GPU, and the wheel that ships it."""

    name: str  # "cudnn"
    soname: str  # "libcudnn.so.9": the name TensorFlow dlopens (CUDA 12 builds)
    package: str  # "cudnn": site-packages/nvidia/<package>/lib
    wheel: str  # "nvidia-cudnn-cu12"


# In dependency order: each library's own dependencies are loaded (RTLD_GLOBAL) before it,
# as they would be in TensorFlow's process (cusparse and cusolver need nvJitLink, cusolver
# needs cuBLAS and cuSPARSE).
LIBRARIES: tuple[LibrarySpec, ...] = (
    LibrarySpec("cudart", "libcudart.so.12", "cuda_runtime", "nvidia-cuda-runtime-cu12"),
    LibrarySpec("nvjitlink", "libnvJitLink.so.12", "nvjitlink", "nvidia-nvjitlink-cu12"),
    LibrarySpec("cublasLt", "libcublasLt.so.12", "cublas", "nvidia-cublas-cu12"),
    LibrarySpec("cublas", "libcublas.so.12", "cublas", "nvidia-cublas-cu12"),
    LibrarySpec("cufft", "libcufft.so.11", "cufft", "nvidia-cufft-cu12"),
    LibrarySpec("curand", "libcurand.so.10", "curand", "nvidia-curand-cu12"),
    LibrarySpec("cusparse", "libcusparse.so.12", "cusparse", "nvidia-cusparse-cu12"),
    LibrarySpec("cusolver", "libcusolver.so.11", "cusolver", "nvidia-cusolver-cu12"),
    LibrarySpec("cudnn", "libcudnn.so.9", "cudnn", "nvidia-cudnn-cu12"),
    LibrarySpec("nccl", "libnccl.so.2", "nccl", "nvidia-nccl-cu12"),
)
LIBRARY_NAMES = tuple(spec.name for spec in LIBRARIES)


def spec(name: str) -> LibrarySpec:
    """The `LIBRARIES` entry called `name` ('cudnn'). Raises KeyError for another name."""
    for candidate in LIBRARIES:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


@dataclass(frozen=True)
class LoadedLibrary:
    """A library that loaded: from where, found how, and its version where it reports one."""

    path: str
    source: str  # "LD_LIBRARY_PATH", "wheel", "system", "already loaded"
    version: str | None = None  # cudart "12.5", cuDNN "9.3.0", NCCL "2.27.7"
    # The file of the NVIDIA wheel TensorFlow's RUNPATH points to, when it exists: what
    # should have loaded (None: no wheel installed).
    wheel: str | None = None


@dataclass(frozen=True)
class CudaStack:
    """Every library TensorFlow opens for the GPU, ptxas and libdevice, as found here."""

    libraries: dict[str, Probed[LoadedLibrary]] = field(default_factory=dict)
    ptxas: Probed[CudaTool] = field(default_factory=Probed)
    libdevice: Probed[str] = field(default_factory=Probed)  # path of libdevice.10.bc
    wheel_root: str = ""  # site-packages/nvidia, where the NVIDIA wheels go
    # DT_RUNPATH (or DT_RPATH) of TensorFlow's libtensorflow_framework.so.2: where its dlopen
    # looks after LD_LIBRARY_PATH (tensorflow#63362: 2.16's missed the NVIDIA wheels).
    tensorflow_runpath: Probed[str] = field(default_factory=Probed)

    def library(self, name: str) -> Probed[LoadedLibrary]:
        return self.libraries.get(name, Probed(error="not probed"))

    @property
    def missing(self) -> list[str]:
        """The libraries that did not load, by name, in load order."""
        return [name for name in LIBRARY_NAMES if not self.library(name).ok]


# ------------------------------------------------------------------------ where to look


def library_candidates(
    library: LibrarySpec, environ: Mapping[str, str], root: Path
) -> list[tuple[str, str]]:
    """(what to dlopen, how it was found) in the loader's order; the last is the bare soname,
    which the system loader resolves (ld.so.cache, /lib, /usr/lib)."""
    found: list[tuple[str, str]] = []
    for folder in environ.get("LD_LIBRARY_PATH", "").split(":"):
        if folder and Path(folder, library.soname).exists():
            found.append((str(Path(folder, library.soname)), "LD_LIBRARY_PATH"))
    wheel = root / library.package / "lib" / library.soname
    if wheel.exists():
        found.append((str(wheel), "wheel"))
    found.append((library.soname, "system"))
    return found


def mapped_libraries(prefix: str) -> list[str]:
    """Files this process has mapped whose name starts with `prefix` ('libcudnn.so')."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    paths: list[str] = []
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if Path(path).name.startswith(prefix) and path not in paths:
            paths.append(path)
    return paths


def soname_prefix(soname: str) -> str:
    return soname.split(".so")[0] + ".so"  # libcudnn.so.9 -> libcudnn.so


# ------------------------------------------------------------------------------- loading


def load_library(path: str) -> Any:
    """dlopen `path` globally, as TensorFlow's loader does. Replaced in tests."""
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


TF_FRAMEWORK = "libtensorflow_framework.so.2"
_DT_RPATH, _DT_RUNPATH, _DT_STRTAB = 15, 29, 5


def elf_runpath(path: Path) -> str:
    """DT_RUNPATH (else DT_RPATH) of a 64-bit little-endian ELF shared object, as
    `readelf -d` shows it ("" when it has none). Raises OSError/ValueError."""
    import struct

    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        raise ValueError(f"{path} has no dynamic section")
    entries: dict[int, int] = {}
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == 0:
            break
        entries.setdefault(tag, value)
    which = entries.get(_DT_RUNPATH, entries.get(_DT_RPATH))
    if which is None:
        return ""
    strtab = entries[_DT_STRTAB]
    base = next(o + strtab - v for v, o, size in loads if v <= strtab < v + size)
    end = data.index(b"\0", base + which)
    return data[base + which:end].decode()


def decode_cudnn_version(encoded: int) -> str:
    """cudnnGetVersion()'s number as text: 90300 -> '9.3.0' (cuDNN 9), 8902 -> '8.9.2' (8)."""
    if encoded >= 90000:  # cuDNN 9: major*10000 + minor*100 + patch
        return f"{encoded // 10000}.{(encoded % 10000) // 100}.{encoded % 100}"
    return f"{encoded // 1000}.{(encoded % 1000) // 100}.{encoded % 100}"


def decode_nccl_version(encoded: int) -> str:
    """ncclGetVersion()'s number as text: 22707 -> '2.27.7'; before 2.9, 2708 -> '2.7.8'."""
    if encoded >= 10000:  # NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch
        return f"{encoded // 10000}.{(encoded % 10000) // 100}.{encoded % 100}"
    return f"{encoded // 1000}.{(encoded % 1000) // 100}.{encoded % 100}"


def _cuda_version(encoded: int) -> str:
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"  # 12050 -> 12.5


def library_version(name: str, handle: Any) -> str | None:
    """The version a loaded library reports (cuDNN, NCCL, cudart); None for the others.

    None of these calls needs a GPU or a driver.
    """
    if name == "cudnn":
        get = handle.cudnnGetVersion
        get.restype = ctypes.c_size_t
        return decode_cudnn_version(int(get()))
    out = ctypes.c_int(0)
    if name == "nccl":
        if handle.ncclGetVersion(ctypes.byref(out)) != 0:
            raise RuntimeError("ncclGetVersion failed")
        return decode_nccl_version(out.value)
    if name == "cudart":
        if handle.cudaRuntimeGetVersion(ctypes.byref(out)) != 0:
            raise RuntimeError("cudaRuntimeGetVersion failed")
        return _cuda_version(out.value)
    return None


def _short_error(err: OSError) -> str:
    # dlerror() text: "<path>: cannot open shared object file: No such file or directory"
    return str(err).split(": ", 1)[-1] if ": " in str(err) else str(err)


def probe_library(
    library: LibrarySpec, environ: Mapping[str, str] | None = None, root: Path | None = None
) -> Probed[LoadedLibrary]:
    """Find and load one library where TensorFlow would; never raises."""
    environ = os.environ if environ is None else environ
    root = wheel_root() if root is None else root
    mapped = mapped_libraries(soname_prefix(library.soname))
    candidates = [(path, "already loaded") for path in mapped] + library_candidates(
        library, environ, root
    )
    tried = []
    for target, source in candidates:
        try:
            handle = load_library(target)
        except OSError as err:
            tried.append(f"{target} ({_short_error(err)})")
            continue
        version = probe(lambda h=handle: library_version(library.name, h))  # type: ignore[misc]
        path = target
        if source == "system":  # report the file the loader chose, not the bare soname
            path = next(iter(mapped_libraries(soname_prefix(library.soname))), target)
        wheel = root / library.package / "lib" / library.soname
        return Probed(value=LoadedLibrary(path, source, version.value if version.ok else None,
                                          str(wheel) if wheel.exists() else None))
    if len(tried) == 1 and "No such file" in tried[0]:  # no candidate file anywhere
        return Probed(
            error=f"{library.soname} is not in LD_LIBRARY_PATH, "
            f"{root / library.package / 'lib'} or the system loader's folders"
        )
    return Probed(error=f"{library.soname} does not load: " + "; ".join(tried))


def nccl_loadable(environ: Mapping[str, str] | None = None) -> bool:
    """Whether NCCL (libnccl.so.2) loads from where TensorFlow looks for it.

    TensorFlow opens NCCL only at the first NCCL all-reduce; without it that all-reduce
    fails. The run planning passes this as `plan_strategy(..., nccl_available=...)`, with
    `nccl_possible()` (Linux CUDA build), so `CROSS_DEVICE_OPS=auto` picks NCCL only when it
    really loads. Costs milliseconds; loads NCCL into this process (TensorFlow would too).
    """
    if not sys.platform.startswith("linux"):
        return False
    return probe_library(spec("nccl"), environ).ok


# -------------------------------------------------------------------------------- collect


def collect_in_process(environ: Mapping[str, str] | None = None) -> CudaStack:
    """Load every library here, find ptxas and libdevice. Never raises."""
    environ = os.environ if environ is None else environ
    root = probe(wheel_root)
    root_path = root.value if root.ok and root.value is not None else Path("nvidia")
    tf_dir = root_path.parent / "tensorflow"
    return CudaStack(
        libraries={lib.name: probe_library(lib, environ, root_path) for lib in LIBRARIES},
        ptxas=probe(lambda: find_ptxas(environ, tf_dir)),
        libdevice=probe(lambda: find_libdevice(environ, tf_dir)),
        wheel_root=str(root_path),
        tensorflow_runpath=probe(lambda: elf_runpath(tf_dir / TF_FRAMEWORK)),
    )


def failed(reason: str) -> CudaStack:
    """A stack whose every probe failed for `reason`."""
    return CudaStack(
        libraries={name: Probed(error=reason) for name in LIBRARY_NAMES},
        ptxas=Probed(error=reason),
        libdevice=Probed(error=reason),
    )


def _probed_json(p: Probed[Any]) -> dict[str, Any]:
    value = p.value.__dict__ if isinstance(p.value, LoadedLibrary | CudaTool) else p.value
    return {"value": value, "error": p.error}


def _probed_from(item: Mapping[str, Any], make: Callable[[Any], Any]) -> Probed[Any]:
    if item["error"] is not None:
        return Probed(error=item["error"])
    return Probed(value=make(item["value"]))


def to_json(stack: CudaStack) -> str:
    return json.dumps(
        {
            "libraries": {k: _probed_json(v) for k, v in stack.libraries.items()},
            "ptxas": _probed_json(stack.ptxas),
            "libdevice": _probed_json(stack.libdevice),
            "wheel_root": stack.wheel_root,
            "tensorflow_runpath": _probed_json(stack.tensorflow_runpath),
        }
    )


def from_json(text: str) -> CudaStack:
    data = json.loads(text)
    return CudaStack(
        libraries={
            k: _probed_from(v, lambda d: LoadedLibrary(**d)) for k, v in data["libraries"].items()
        },
        ptxas=_probed_from(data["ptxas"], lambda d: CudaTool(**d)),
        libdevice=_probed_from(data["libdevice"], str),
        wheel_root=str(data.get("wheel_root", "")),
        tensorflow_runpath=_probed_from(data["tensorflow_runpath"],
                                        lambda v: None if v is None else str(v))
        if "tensorflow_runpath" in data else Probed(error="not probed"),
    )


def collect(environ: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> CudaStack:
    """Run `collect_in_process` in a child Python with `environ`. Never raises."""
    done = childprobe.ask([sys.executable, "-m", "mgpu_env.hardware.cudalibs"], environ,
                          marker=JSON_MARKER, timeout_s=timeout_s)
    why = done.no_answer("the CUDA library probe", timeout_s)
    if why is not None or done.answer is None:
        return failed(why or "no answer")
    try:
        return from_json(done.answer)
    except (ValueError, KeyError, TypeError) as err:
        return failed(f"unreadable answer from the CUDA library probe: {err}")


def main() -> None:
    print(JSON_MARKER + to_json(collect_in_process()), flush=True)


if __name__ == "__main__":
    main()
