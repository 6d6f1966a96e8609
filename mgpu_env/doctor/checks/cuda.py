"""The checks of TensorFlow's CUDA stack, as it will really open here.

TensorFlow's CUDA stack: its build, and the libraries, cuDNN, NCCL, ptxas and libdevice it will
really open here (`mgpu_env.hardware.cudalibs`)."""

from __future__ import annotations

import os

from mgpu_env.doctor.checks.common import (
    TF_NOT_PROBED,
    TF_SKIPPED,
    Check,
    CheckId,
    Skipped,
    Status,
    check,
    fewer_than_two_gpus,
    no_gpu,
    target_build,
    wants_gpus,
)
from mgpu_env.doctor.checks.libraries import origin_of, shadowed_libraries
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import compat
from mgpu_env.hardware.cudalibs import LIBRARIES, CudaStack, LoadedLibrary

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
TENSORFLOW_BUILD = CheckId("tensorflow.build")
TENSORFLOW_CUDNN = CheckId("tensorflow.cudnn")
CUDA_LIBRARIES = CheckId("cuda.libraries")
CUDA_NCCL = CheckId("cuda.nccl")
CUDA_PTXAS = CheckId("cuda.ptxas")
CUDA_LIBDEVICE = CheckId("cuda.libdevice")

FIX_CUDA_LIBRARIES = (
    "install the CUDA libraries TensorFlow was built with: `make venv CUDA=1` (the CUDA "
    "lock) or the image (`make build`); by hand: `pip install 'tensorflow[and-cuda]=={tf}'`"
)
FIX_NVCC = (
    "install ptxas and libdevice where XLA looks: `make venv CUDA=1` or the image (both carry "
    "nvidia-cuda-nvcc-cu12 {cuda}.*), or point XLA at a CUDA toolkit: "
    "XLA_FLAGS=--xla_gpu_cuda_data_dir=/usr/local/cuda-{cuda}"
)


@check(70, TENSORFLOW_BUILD, preflight=True)
def check_tf_build(facts: Facts) -> Check:
    title = "TensorFlow build"
    row = target_build(facts)
    expected = f"a CUDA build: CUDA {row.cuda}, cuDNN {row.cudnn} (TensorFlow {row.tensorflow})"
    tf = facts.tensorflow
    if tf is None:
        return TENSORFLOW_BUILD(title, "skip", TF_SKIPPED, expected,
                                skipped_for=TF_NOT_PROBED)
    if not tf.version.ok:
        return TENSORFLOW_BUILD(
            title, "error", tf.version.text(), expected,
            "reinstall the pinned packages: `pip install -r requirements.lock` (or rebuild "
            "the image: `make build`)",
        )
    build = tf.build
    if not build.ok or build.value is None:
        return TENSORFLOW_BUILD(title, "warn", build.text(), expected)
    info = build.value
    if not info.is_cuda_build:
        found = f"TensorFlow {tf.version.value}: CPU-only build"
        if facts.gpus and wants_gpus(facts):
            return TENSORFLOW_BUILD(
                title, "error",
                f"{found}, but NVML sees {len(facts.gpus)} GPU(s)", expected,
                f"install the CUDA build: `pip install 'tensorflow[and-cuda]=="
                f"{tf.version.value}'`, or use the project's image (`make build`)",
            )
        return TENSORFLOW_BUILD(title, "ok", found + " (no GPU to use)", expected)
    capabilities = ", ".join(info.compute_capabilities) or "none listed"
    found = (
        f"TensorFlow {tf.version.value}: CUDA {info.cuda_version}, cuDNN "
        f"{info.cudnn_version}, compute capabilities {capabilities}"
    )
    if info.cuda_version and compat.minor_of(info.cuda_version) != row.cuda:
        return TENSORFLOW_BUILD(
            title, "warn", found, expected,
            "the compatibility table in mgpu_env/hardware/compat.py disagrees with this build: "
            "update the table (and the Dockerfile's pins) or install the pinned TensorFlow",
        )
    return TENSORFLOW_BUILD(title, "ok", found, expected)


@check(100, TENSORFLOW_CUDNN, preflight=True)
def check_cudnn(facts: Facts) -> Check:
    title = "cuDNN loaded"
    row = target_build(facts)
    expected = f"cuDNN {row.cudnn}.x or a later {row.cudnn.split('.')[0]}.x"
    tf = facts.tensorflow
    if tf is None:
        return TENSORFLOW_CUDNN(title, "skip", TF_SKIPPED, expected,
                                skipped_for=TF_NOT_PROBED)
    found = (
        f"{tf.cudnn.value.version} ({tf.cudnn.value.path})"
        if tf.cudnn.ok and tf.cudnn.value is not None
        else tf.cudnn.text()
    )
    info = tf.build.value if tf.build.ok else None
    if info is None or not info.is_cuda_build or not facts.selected:
        return _cudnn_unused(facts, found, expected + " (only with GPUs)")
    fix = (
        f"install cuDNN {row.cudnn}: `make venv CUDA=1` (the CUDA lock), or "
        f"`pip install 'nvidia-cudnn-cu12=={row.cudnn}.*'` (part of tensorflow[and-cuda]), "
        "or use the image (`make build`)"
    )
    if not tf.cudnn.ok or tf.cudnn.value is None:
        return TENSORFLOW_CUDNN(title, "error", found, expected, fix)
    problem = _cudnn_problem(facts)
    if problem:
        wheel = facts.cuda.library("cudnn") if facts.cuda is not None else None
        wheel_path = wheel.value.wheel if wheel is not None and wheel.ok and wheel.value else None
        if wheel_path and os.path.realpath(wheel_path) != os.path.realpath(tf.cudnn.value.path):
            what, fix = origin_of(tf.cudnn.value.path, facts)
            problem += f", loaded from {what} instead of {wheel_path}"
        return TENSORFLOW_CUDNN(title, "error", found + problem, expected, fix)
    return TENSORFLOW_CUDNN(title, "ok", found, expected)


def _cudnn_problem(facts: Facts) -> str:
    """Why the cuDNN found cannot serve this build ("" when it can)."""
    tf = facts.tensorflow
    if tf is None or tf.cudnn.value is None:
        return ""
    have = compat.version_tuple(tf.cudnn.value.version)
    want = compat.version_tuple(target_build(facts).cudnn)
    if have[0] != want[0]:
        return ": another major version"
    if have[:2] < want:
        # TensorFlow refuses it at the first cuDNN call: "Loaded runtime CuDNN library: 9.1.0
        # but source was compiled with: 9.3.0. ... equal or higher minor version".
        return ": an older minor than the build's, which TensorFlow refuses"
    return ""


def _cudnn_unused(facts: Facts, found: str, expected: str) -> Check:
    """cuDNN where no GPU will use it: a library that is there is reported as found (ok,
    or a skip that names its version problem); a missing one is one more GPU-only skip."""
    tf = facts.tensorflow
    info = tf.build.value if tf is not None and tf.build.ok else None
    if info is not None and not info.is_cuda_build:
        reason = Skipped("GPU", "TensorFlow is a CPU-only build")
    else:
        reason = no_gpu(facts)
    if tf is None or not tf.cudnn.ok or tf.cudnn.value is None:
        return TENSORFLOW_CUDNN("cuDNN loaded", "skip", found, expected,
                                skipped_for=reason)
    problem = _cudnn_problem(facts)
    status: Status = "skip" if problem else "ok"
    return TENSORFLOW_CUDNN("cuDNN loaded", status,
                            f"{found}{problem}; unused here: {reason.why}", expected)


# ----------------------------------------------------------------- the CUDA libraries


def _library_text(name: str, library: LoadedLibrary) -> str:
    version = f" {library.version}" if library.version else ""
    return f"{name}{version}"


def _where(stack: CudaStack) -> str:
    sources = sorted({
        stack.library(spec.name).value.source  # type: ignore[union-attr]
        for spec in LIBRARIES if stack.library(spec.name).ok
    })
    return ", ".join(
        f"{stack.wheel_root}" if source == "wheel" else source for source in sources
    )


@check(80, CUDA_LIBRARIES, preflight=True)
def check_cuda_libraries(facts: Facts) -> Check:
    """Every library TensorFlow opens for the GPU loads, from where TensorFlow looks."""
    title = "CUDA libraries"
    row = target_build(facts)
    names = ", ".join(spec.name for spec in LIBRARIES)
    expected = f"all load for CUDA {row.cuda}: {names}"
    stack = facts.cuda
    if stack is None:
        return CUDA_LIBRARIES(title, "skip", TF_SKIPPED, expected,
                              skipped_for=TF_NOT_PROBED)
    fix = FIX_CUDA_LIBRARIES.format(tf=_tf_release(facts))
    # NCCL is judged on its own line: only an all-reduce between GPUs needs it.
    missing = [name for name in stack.missing if name != "nccl"]
    loaded = [
        _library_text(spec.name, stack.library(spec.name).value)  # type: ignore[arg-type]
        for spec in LIBRARIES if stack.library(spec.name).ok
    ]
    if not missing:
        return CUDA_LIBRARIES(title, "ok",
                              f"{len(loaded)} of {len(LIBRARIES)} load from {_where(stack)}: "
                              + ", ".join(loaded), expected)
    if not loaded:
        found = (
            f"none installed (no NVIDIA CUDA wheels in {stack.wheel_root}, none on the "
            "system loader's path)"
        )
    else:
        found = "; ".join(
            f"{name}: {stack.library(name).error}" for name in missing
        ) + (f"; loaded: {', '.join(loaded)}" if loaded else "")
    if not facts.selected:
        return CUDA_LIBRARIES(title, "skip",
                              f"{found}; only GPUs need them; to add them: {fix}", expected,
                              skipped_for=no_gpu(facts))
    shadows = shadowed_libraries(facts)
    if shadows and any("undefined symbol" in (stack.library(n).error or "") for n in missing):
        # Not a missing install: an older copy found first lacks its partner's symbols.
        found += "; loaded first: " + ", ".join(f"{s.name} from {s.what}" for s in shadows)
        fix = "; ".join(dict.fromkeys(s.fix for s in shadows))
    return CUDA_LIBRARIES(title, "error",
                          f"{found}: TensorFlow will not use the GPUs", expected, fix)


def _tf_release(facts: Facts) -> str:
    version = facts.versions.get("TensorFlow")
    if facts.tensorflow is not None and facts.tensorflow.version.ok:
        version = facts.tensorflow.version
    return (version.value if version is not None and version.ok and version.value
            else compat.PINNED_TENSORFLOW + ".*")


@check(110, CUDA_NCCL, preflight=True)
def check_nccl(facts: Facts) -> Check:
    """NCCL loads (ncclGetVersion) when an all-reduce between GPUs will need it."""
    title = "NCCL"
    row = target_build(facts)
    expected = (
        f"NCCL >= {row.nccl_min} (tensorflow[and-cuda] {row.tensorflow})" if row.nccl_min
        else "NCCL 2.x loads"
    ) + " when 2 or more GPUs all-reduce"
    stack = facts.cuda
    if stack is None:
        return CUDA_NCCL(title, "skip", TF_SKIPPED, expected,
                         skipped_for=TF_NOT_PROBED)
    nccl = stack.library("nccl")
    if nccl.ok and nccl.value is not None:
        found = f"NCCL {nccl.value.version or 'version unknown'} ({nccl.value.path})"
        if (
            row.nccl_min and nccl.value.version
            and compat.version_tuple(nccl.value.version) < compat.version_tuple(row.nccl_min)
        ):
            status: Status = "warn" if len(facts.selected) >= 2 else "ok"
            return CUDA_NCCL(title, status, found + ": older than the build asks",
                             expected, f"`pip install 'nvidia-nccl-cu12>={row.nccl_min}'` "
                             "(or `make venv CUDA=1`, the image)")
        return CUDA_NCCL(title, "ok", found, expected)
    found = nccl.text()
    if len(facts.selected) < 2:
        return CUDA_NCCL(title, "skip", found,
                         expected + f" ({len(facts.selected)} GPU(s) used: nothing to all-reduce)",
                         skipped_for=fewer_than_two_gpus(facts))
    fix = (
        f"`pip install 'nvidia-nccl-cu12>={row.nccl_min or '2'}'` (or `make venv CUDA=1`, "
        "the image); or CROSS_DEVICE_OPS=hierarchical_copy"
    )
    if facts.cross_device_ops == "nccl":
        return CUDA_NCCL(title, "error",
                         found + ": CROSS_DEVICE_OPS=nccl fails at the first all-reduce",
                         expected, fix)
    return CUDA_NCCL(title, "warn",
                     found + f": CROSS_DEVICE_OPS={facts.cross_device_ops} cannot use NCCL and "
                     "all-reduces through host memory instead (slower)", expected, fix)


XLA_OFF = Skipped("XLA", "XLA=0 with Keras 3: only XLA=1, tf_keras (KERAS=2, a multi-worker "
                          "script) and `mgpu doctor --smoke` need them")


def _xla_matters(facts: Facts) -> tuple[bool, str, Skipped | None]:
    """Whether XLA's GPU tools matter here, why, and the shared reason when they do not."""
    if not facts.selected:
        return False, "only GPUs need it (XLA on the CPU compiles with LLVM alone)", no_gpu(facts)
    if facts.xla:
        return True, "XLA=1 compiles every GPU step with it", None
    keras = facts.keras
    if keras.train is not None and keras.train.version == "2":
        return True, ("mgpu train's optimizer is tf_keras's, which compiles its update with "
                      "XLA on GPUs even with XLA=0 (keras-team/keras#17422)"), None
    if keras.run is not None and keras.run.version == "2":
        why = ("a multi-worker `mgpu run` script gets tf_keras" if facts.cluster.cluster
               else "a script under `mgpu run` gets tf_keras (KERAS=2)")
        return True, (f"{why}, whose optimizers compile their update with XLA on GPUs even "
                      "with XLA=0 (keras-team/keras#17422)"), None
    return False, "only XLA=1 (and `mgpu doctor --smoke`) needs it", XLA_OFF


@check(130, CUDA_PTXAS)
def check_ptxas(facts: Facts) -> Check:
    """The ptxas XLA would run, and its version against the build's CUDA."""
    title = "ptxas (XLA)"
    row = target_build(facts)
    expected = f"ptxas {row.cuda} (CUDA of the build) in XLA's search path"
    stack = facts.cuda
    if stack is None:
        return CUDA_PTXAS(title, "skip", TF_SKIPPED, expected,
                          skipped_for=TF_NOT_PROBED)
    matters, why, reason = _xla_matters(facts)
    fix = FIX_NVCC.format(cuda=row.cuda)
    if not stack.ptxas.ok or stack.ptxas.value is None:
        found = stack.ptxas.text()
        if not matters:
            return CUDA_PTXAS(title, "skip", f"{found}; {why}", expected,
                              skipped_for=reason)
        return CUDA_PTXAS(title, "warn", f"{found}; {why}", expected, fix)
    tool = stack.ptxas.value
    found = f"{tool.version} ({tool.path})"
    if compat.minor_of(tool.version) != row.cuda:
        return CUDA_PTXAS(title, "warn" if matters else "ok",
                          found + f": not CUDA {row.cuda}", expected, fix)
    return CUDA_PTXAS(title, "ok", found, expected)


@check(140, CUDA_LIBDEVICE)
def check_libdevice(facts: Facts) -> Check:
    """libdevice.10.bc where XLA looks for it (the first <root>/nvvm/libdevice)."""
    title = "libdevice (XLA)"
    expected = "nvvm/libdevice/libdevice.10.bc in the first CUDA root XLA finds"
    stack = facts.cuda
    if stack is None:
        return CUDA_LIBDEVICE(title, "skip", TF_SKIPPED, expected,
                              skipped_for=TF_NOT_PROBED)
    if stack.libdevice.ok and stack.libdevice.value:
        return CUDA_LIBDEVICE(title, "ok", stack.libdevice.value, expected)
    matters, why, reason = _xla_matters(facts)
    found = f"{stack.libdevice.text()}; {why}"
    if not matters:
        return CUDA_LIBDEVICE(title, "skip", found, expected, skipped_for=reason)
    return CUDA_LIBDEVICE(title, "warn", found, expected,
                          FIX_NVCC.format(cuda=target_build(facts).cuda))
