"""The CUDA library files TensorFlow really loads, against the NVIDIA wheels it expects.

The CUDA library files TensorFlow really loads (its /proc/self/maps after it listed its GPUs)
against the NVIDIA wheels its RUNPATH points to: what shadowed them (an LD_LIBRARY_PATH entry,
a conda environment, another package's wheel, /usr/local/cuda) and the fix that removes it; a
TensorFlow whose RUNPATH misses the wheels (tensorflow#63362)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from mgpu_env.doctor.checks.common import (
    TF_NOT_PROBED,
    TF_SKIPPED,
    Check,
    CheckId,
    Status,
    check,
    no_gpu,
)
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware.cudalibs import LIBRARIES, TF_FRAMEWORK, CudaStack, soname_prefix

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
CUDA_LOADED = CheckId("cuda.loaded")


def _folders(value: str) -> list[str]:
    return [f for f in value.split(":") if f]


def _same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a.rstrip("/")) == os.path.realpath(b.rstrip("/"))


def origin_of(path: str, facts: Facts) -> tuple[str, str]:
    """What put `path` before the NVIDIA wheel's copy, and the fix that removes it."""
    folder = os.path.dirname(path)
    conda = facts.environ.get("CONDA_PREFIX", "")
    for entry in _folders(facts.environ.get("LD_LIBRARY_PATH", "")):
        if _same_folder(entry, folder):
            what = f"the LD_LIBRARY_PATH entry {entry}"
            fix = f"remove {entry} from LD_LIBRARY_PATH"
            if (conda and folder.startswith(conda)) or "conda" in folder:
                what += " (a conda environment's libraries)"
                fix += (" (a conda environment sets it: `conda env config vars unset "
                        "LD_LIBRARY_PATH`, or its etc/conda/activate.d script)")
            elif "site-packages" in folder:
                what += " (another Python package's NVIDIA wheel)"
            elif folder.startswith("/usr/local/cuda"):
                what += " (a system CUDA toolkit)"
            return what, fix + ", and in ~/.bashrc where it is set"
    if folder.startswith("/usr/local/cuda") or "/cuda-" in folder:
        return (f"the system CUDA toolkit in {folder} (through ld.so.cache)",
                f"remove {folder} from /etc/ld.so.conf.d/ and run `sudo ldconfig`, or install "
                "the wheels (`make venv CUDA=1`)")
    if "site-packages" in folder:
        return (f"another Python package's copy in {folder}",
                f"uninstall the package that ships {os.path.basename(path)} in {folder}, or "
                "import TensorFlow first")
    return f"the system loader's copy in {folder}", "install the wheels (`make venv CUDA=1`)"


@dataclass(frozen=True)
class Shadowed:
    """A CUDA library that loads from elsewhere than the NVIDIA wheel TensorFlow expects."""

    name: str
    path: str
    wheel: str
    what: str
    fix: str
    in_tensorflow: bool  # seen in TensorFlow's own process (else: where the loader goes)


def _name_of(path: str) -> str | None:
    base = os.path.basename(path)
    for spec in LIBRARIES:
        if base.startswith(soname_prefix(spec.soname)):
            return spec.name
    return None


def shadowed_libraries(facts: Facts) -> list[Shadowed]:
    """Every library whose wheel copy exists but another file loads: in TensorFlow's
    process (its /proc/self/maps), else where the loader would take it (cudalibs)."""
    stack = facts.cuda
    if stack is None:
        return []
    found: dict[str, Shadowed] = {}
    tf = facts.tensorflow
    mapped = tf.loaded.value if tf is not None and tf.loaded.ok and tf.loaded.value else ()
    candidates = [(p, True) for p in mapped]
    candidates += [(lib.value.path, False) for lib in stack.libraries.values()
                   if lib.ok and lib.value is not None]
    for path, in_tf in candidates:
        name = _name_of(path)
        if name is None or name in found:
            continue
        library = stack.library(name)
        wheel = library.value.wheel if library.ok and library.value is not None else None
        if wheel is None and library.ok is False:
            continue
        if wheel is None or os.path.realpath(path) == os.path.realpath(wheel):
            continue
        what, fix = origin_of(path, facts)
        found[name] = Shadowed(name, path, wheel, what, fix, in_tf)
    return [found[s.name] for s in LIBRARIES if s.name in found]


def _runpath_misses_wheels(facts: Facts) -> bool:
    """TensorFlow's RUNPATH has no NVIDIA wheel folder although the wheels are installed."""
    stack = facts.cuda
    if stack is None or not stack.tensorflow_runpath.ok or stack.tensorflow_runpath.value is None:
        return False
    wheels = any(lib.ok and lib.value is not None and lib.value.wheel
                 for lib in stack.libraries.values())
    return wheels and "nvidia" not in stack.tensorflow_runpath.value


def runpath_fix(stack: CudaStack) -> str:
    folders = ":".join(dict.fromkeys(f"{stack.wheel_root}/{spec.package}/lib"
                                     for spec in LIBRARIES))
    return ("install the pinned TensorFlow, whose RUNPATH has them (`pip install -r "
            "requirements.lock`), or put the wheels on the loader's path: "
            f"`export LD_LIBRARY_PATH={folders}`")


def library_cause(facts: Facts) -> tuple[str, str] | None:
    """(cause, fix) when the CUDA libraries explain a TensorFlow without its GPUs: a copy
    that shadows the wheels (named, with the entry to remove), or a RUNPATH that misses
    them; None otherwise."""
    shadows = shadowed_libraries(facts)
    if shadows:
        return ("CUDA libraries load from elsewhere than the wheels: "
                + ", ".join(f"{s.name} from {s.what}" for s in shadows),
                "; ".join(dict.fromkeys(s.fix for s in shadows)))
    if facts.cuda is not None and _runpath_misses_wheels(facts):
        return ("TensorFlow's RUNPATH misses the NVIDIA wheels (tensorflow#63362)",
                runpath_fix(facts.cuda))
    return None


_NOT_LOADED = re.compile(r"Could not load dynamic library '?([\w.+-]+\.so[\w.]*)'?")


def search_path_cause(facts: Facts) -> tuple[str, str] | None:
    """(cause, fix) when TensorFlow says it could not load a library that the doctor's own
    probe loaded: the file is there, TensorFlow's loader does not search where it is (its
    RUNPATH, LD_LIBRARY_PATH); the fix adds that folder."""
    tf, stack = facts.tensorflow, facts.cuda
    if tf is None or stack is None or not tf.log:
        return None
    for soname in _NOT_LOADED.findall("\n".join(tf.log)):
        for spec in LIBRARIES:
            loaded = stack.library(spec.name)
            if soname_prefix(spec.soname) != soname_prefix(soname) or not loaded.ok \
                    or loaded.value is None or "/" not in loaded.value.path:
                continue
            folder = os.path.dirname(loaded.value.path)
            return (f"TensorFlow could not load {soname}, but it loads from {folder} "
                    f"({loaded.value.source}): TensorFlow's loader does not search there "
                    "(its RUNPATH, LD_LIBRARY_PATH)",
                    f"add the folder to the loader's path: `export LD_LIBRARY_PATH={folder}"
                    "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}`, then rerun `mgpu doctor`")
    return None


@check(90, CUDA_LOADED)
def check_tf_libraries(facts: Facts) -> Check:
    """The CUDA library files TensorFlow really loaded, against the NVIDIA wheels its
    RUNPATH points to; names what shadowed them and how to remove it."""
    title = "TF's CUDA libraries"
    stack, tf = facts.cuda, facts.tensorflow
    expected = "the NVIDIA wheels' files in site-packages/nvidia (TensorFlow's RUNPATH)"
    if stack is None or tf is None:
        return CUDA_LOADED(title, "skip", TF_SKIPPED, expected,
                           skipped_for=TF_NOT_PROBED)
    if not facts.selected:
        return CUDA_LOADED(title, "skip", "no GPU used", expected,
                           skipped_for=no_gpu(facts))
    shadows = shadowed_libraries(facts)
    listed = tf.num_gpus
    short = listed is not None and listed < len(facts.selected)
    undefined = [name for name in stack.missing
                 if "undefined symbol" in (stack.library(name).error or "")]
    if _runpath_misses_wheels(facts) and short and not shadows:
        return CUDA_LOADED(
            title, "error",
            f"TensorFlow's {TF_FRAMEWORK} has RUNPATH {stack.tensorflow_runpath.value!r}, "
            f"without the NVIDIA wheels in {stack.wheel_root}: its dlopen does not find "
            "them, although they load (tensorflow#63362)",
            expected, runpath_fix(stack),
        )
    mapped = tf.loaded.value if tf.loaded.ok and tf.loaded.value else ()
    if not shadows:
        if undefined:
            return CUDA_LOADED(title, "error",
                               "; ".join(f"{n}: {stack.library(n).error}" for n in undefined),
                               expected, "see the CUDA libraries line")
        where = f"{len(mapped)} CUDA libraries mapped" if mapped else "no CUDA library mapped"
        return CUDA_LOADED(title, "ok",
                           f"{where} in TensorFlow's process, none shadowing the wheels in "
                           f"{stack.wheel_root}", expected)
    found = "; ".join(
        f"{s.name}: {s.path} ({s.what}) instead of {s.wheel}"
        + ("" if s.in_tensorflow else " (where the loader goes)") for s in shadows)
    if undefined:
        found += "; " + "; ".join(f"{n}: {stack.library(n).error}" for n in undefined)
    fix = "; ".join(dict.fromkeys(s.fix for s in shadows))
    status: Status = "error" if short or undefined else "warn"
    return CUDA_LOADED(title, status, found, expected, fix)
