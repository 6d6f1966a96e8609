"""The checks: pure functions from `Facts` to `Check`s (ok / warn / error / skip).

Each check says what it found, what it expected and, when something is wrong, the fix.
`skip` means the check does not apply here (no GPU to look at, TensorFlow not probed);
it never changes the exit code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from mgpu_env.doctor.facts import UNLIMITED, Facts
from mgpu_env.hardware import compat
from mgpu_env.hardware.devices import visible_gpus
from mgpu_env.hardware.nvml import GpuInfo, GpuLink, Probed

Status = Literal["ok", "warn", "error", "skip"]
MIB = 1024 * 1024
DOCKER_DEFAULT_SHM = 64 * MIB

FIX_DRIVER_IN_CONTAINER = (
    "start the container with the GPUs: `docker run --gpus all ...`, or in compose "
    "`gpus: all` (or deploy.resources.reservations.devices with driver nvidia); the host "
    "needs the NVIDIA driver and the NVIDIA Container Toolkit "
    "(`sudo nvidia-ctk runtime configure --runtime=docker` and restart Docker)"
)
FIX_DRIVER_ON_HOST = (
    "install the NVIDIA driver (`nvidia-smi` must work), or set GPUS=none to train on the CPU"
)
NCCL_HINTS = (
    "NCCL_DEBUG=INFO shows the transport NCCL picks; NCCL_P2P_LEVEL=SYS allows P2P across "
    "host bridges/sockets where the platform supports it; NCCL_P2P_DISABLE=1 if P2P hangs "
    "(IOMMU/ACS); keep NCCL_SHM_DISABLE unset and /dev/shm large for the shared-memory path; "
    "or pick GPUs that share a switch/NVLink with GPUS=..."
)

# A consequence of a failing driver line: shown, but not counted as a warning of its own.
SAME_CAUSE_AS_NVML = " (a consequence of the Driver (NVML) line)"


@dataclass(frozen=True)
class Check:
    """One judged finding. `bad_setting`: the error is a setting the user must change."""

    id: str
    title: str
    status: Status
    found: str
    expected: str = ""
    fix: str = ""
    bad_setting: bool = False


# ----------------------------------------------------------------------------- helpers


def target_build(facts: Facts) -> compat.TfBuild:
    """The table row for the TensorFlow installed here, else the pinned one."""
    version = facts.versions.get("TensorFlow", Probed())
    if facts.tensorflow is not None and facts.tensorflow.version.ok:
        version = facts.tensorflow.version
    row = compat.for_tensorflow(version.value) if version.ok and version.value else None
    return row or compat.pinned()


def _nvml_fix(facts: Facts) -> str:
    return FIX_DRIVER_IN_CONTAINER if facts.host.in_container.value else FIX_DRIVER_ON_HOST


def _gpu_names(gpus: Iterable[GpuInfo]) -> str:
    return ", ".join(f"GPU {g.index} ({g.name})" for g in gpus) or "none"


def _wants_gpus(facts: Facts) -> bool:
    return facts.request.kind != "none"


def _is_not_supported(probed: Probed[Any]) -> bool:
    return not probed.ok and "not supported" in (probed.error or "").lower()


_CAPABILITY = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


def capability_support(
    capability: tuple[int, int], build_capabilities: Iterable[str]
) -> Literal["native", "ptx", "none"]:
    """How a TensorFlow build runs on a GPU of `capability`.

    `sm_XY` is machine code that runs on X.Y and later minors of the same major ("sm_80"
    runs on 8.6); `compute_XY` is PTX that the driver compiles for any GPU >= X.Y (slow on
    the first start, and it needs a driver at least as new as the build's CUDA). A suffix
    such as sm_90a only runs on exactly that GPU.
    """
    result: Literal["native", "ptx", "none"] = "none"
    for text in build_capabilities:
        match = _CAPABILITY.match(text.strip().lower())
        if not match:
            continue
        kind, digits, suffix = match.groups()
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm":
            fits = capability == built if suffix else (
                capability[0] == built[0] and capability[1] >= built[1]
            )
            if fits:
                return "native"
        elif capability >= built:
            result = "ptx"
    return result


def _indices(indices: list[int]) -> str:
    if not indices:
        return "none"
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


# ------------------------------------------------------------------------------ driver


def check_nvml(facts: Facts) -> Check:
    snapshot = facts.nvml
    listing = snapshot.listing
    title = "Driver (NVML)"
    if listing.available:
        version = snapshot.driver_version.text()
        return Check(
            "driver.nvml", title, "ok",
            f"driver {version}, NVML {snapshot.nvml_version.text()}, {len(listing.gpus)} GPU(s)",
            "NVML loads",
        )
    found = f"could not collect ({listing.error})"
    if not _wants_gpus(facts):
        return Check("driver.nvml", title, "skip", found, "not needed with GPUS=none")
    status: Status = "warn" if facts.request.kind == "all" else "error"
    consequence = " (GPUS=all: training will use the CPU)" if status == "warn" else ""
    return Check(
        "driver.nvml", title, status, found + consequence, "NVML loads", _nvml_fix(facts)
    )


def check_driver_version(facts: Facts) -> Check:
    title = "Driver version"
    row = target_build(facts)
    full, oldest = row.min_driver_linux, row.min_driver_linux_minor_compat
    expected = (
        f">= {full} for CUDA {row.cuda} (TensorFlow {row.tensorflow}); "
        f">= {oldest} runs it with minor-version compatibility"
    )
    if not facts.nvml.listing.available or not facts.gpus:
        found = "no GPU" if facts.nvml.listing.available else "no driver"
        return Check("driver.version", title, "skip", found, expected)
    driver = facts.nvml.driver_version
    if not driver.ok or not driver.value:
        return Check(
            "driver.version", title, "warn", driver.text(), expected,
            "run `nvidia-smi` to see the driver version",
        )
    fix = f"upgrade the host's NVIDIA driver to {full} or newer (a container uses the host's)"
    try:
        if compat.driver_at_least(driver.value, full):
            return Check("driver.version", title, "ok", driver.value, expected)
        if compat.driver_at_least(driver.value, oldest):
            return Check(
                "driver.version", title, "warn",
                f"{driver.value}: runs CUDA {row.cuda} only with minor-version compatibility "
                "(no PTX JIT for GPUs the build has no machine code for)",
                expected, fix,
            )
    except ValueError:
        return Check("driver.version", title, "warn", f"unreadable: {driver.value!r}", expected)
    return Check(
        "driver.version", title, "error",
        f"{driver.value}: too old for CUDA {row.cuda}", expected, fix,
    )


def check_driver_cuda(facts: Facts) -> Check:
    title = "Driver CUDA"
    row = target_build(facts)
    expected = f">= {row.cuda} (the CUDA TensorFlow {row.tensorflow} is built with)"
    if not facts.nvml.listing.available or not facts.gpus:
        found = "no GPU" if facts.nvml.listing.available else "no driver"
        return Check("driver.cuda", title, "skip", found, expected)
    encoded = facts.nvml.cuda_driver_version
    if not encoded.ok or encoded.value is None:
        return Check("driver.cuda", title, "warn", encoded.text(), expected,
                     "run `nvidia-smi`: its header shows 'CUDA Version'")
    supported = compat.cuda_from_nvml(encoded.value)
    have, want = compat.version_tuple(supported), compat.version_tuple(row.cuda)
    fix = (
        f"upgrade the host's NVIDIA driver to {row.min_driver_linux} or newer "
        f"(it then supports CUDA {row.cuda})"
    )
    if have >= want:
        return Check("driver.cuda", title, "ok", supported, expected)
    if have[0] == want[0]:
        # Judged once, by driver.version (a warning there); not a second warning here.
        return Check("driver.cuda", title, "ok",
                     f"{supported}: CUDA {row.cuda} runs with minor-version compatibility",
                     expected)
    return Check("driver.cuda", title, "error",
                 f"{supported}: CUDA {row.cuda} cannot run", expected, fix)


def check_device_files(facts: Facts) -> Check:
    title = "GPU device files"
    host = facts.host
    expected = "/dev/nvidiactl and /dev/nvidia<N> (added by the NVIDIA Container Toolkit)"
    if not host.in_container.ok or not host.in_container.value:
        found = "not in a container" if host.in_container.ok else host.in_container.text()
        return Check("driver.device_files", title, "skip", found, expected)
    files = host.device_files
    if not files.ok:
        return Check("driver.device_files", title, "warn", files.text(), expected)
    names = files.value or ()
    has_gpu_file = any(re.fullmatch(r"nvidia\d+", n) for n in names)
    found = ", ".join(f"/dev/{n}" for n in names) or "no /dev/nvidia* files"
    if "nvidiactl" in names and has_gpu_file:
        return Check("driver.device_files", title, "ok", found, expected)
    if not _wants_gpus(facts):
        return Check("driver.device_files", title, "skip", found, "not needed with GPUS=none")
    status: Status = "warn" if facts.request.kind == "all" else "error"
    if status == "warn" and not facts.nvml.listing.available:
        # One cause, one warning: the driver line already says the container has no GPUs.
        return Check("driver.device_files", title, "skip", found + SAME_CAUSE_AS_NVML, expected)
    return Check("driver.device_files", title, status, found, expected, FIX_DRIVER_IN_CONTAINER)


# -------------------------------------------------------------------------- TensorFlow

TF_SKIPPED = "skipped (--no-tf)"


def check_tf_build(facts: Facts) -> Check:
    title = "TensorFlow build"
    row = target_build(facts)
    expected = f"a CUDA build: CUDA {row.cuda}, cuDNN {row.cudnn} (TensorFlow {row.tensorflow})"
    tf = facts.tensorflow
    if tf is None:
        return Check("tensorflow.build", title, "skip", TF_SKIPPED, expected)
    if not tf.version.ok:
        return Check(
            "tensorflow.build", title, "error", tf.version.text(), expected,
            "reinstall the pinned packages: `pip install -r requirements.lock` (or rebuild "
            "the image: `make build`)",
        )
    build = tf.build
    if not build.ok or build.value is None:
        return Check("tensorflow.build", title, "warn", build.text(), expected)
    info = build.value
    if not info.is_cuda_build:
        found = f"TensorFlow {tf.version.value}: CPU-only build"
        if facts.gpus and _wants_gpus(facts):
            return Check(
                "tensorflow.build", title, "error",
                f"{found}, but NVML sees {len(facts.gpus)} GPU(s)", expected,
                f"install the CUDA build: `pip install 'tensorflow[and-cuda]=="
                f"{tf.version.value}'`, or use the project's image (`make build`)",
            )
        return Check("tensorflow.build", title, "ok", found + " (no GPU to use)", expected)
    capabilities = ", ".join(info.compute_capabilities) or "none listed"
    found = (
        f"TensorFlow {tf.version.value}: CUDA {info.cuda_version}, cuDNN "
        f"{info.cudnn_version}, compute capabilities {capabilities}"
    )
    if info.cuda_version and compat.minor_of(info.cuda_version) != row.cuda:
        return Check(
            "tensorflow.build", title, "warn", found, expected,
            "the compatibility table in mgpu_env/hardware/compat.py disagrees with this build: "
            "update the table (and the Dockerfile's pins) or install the pinned TensorFlow",
        )
    return Check("tensorflow.build", title, "ok", found, expected)


def check_cudnn(facts: Facts) -> Check:
    title = "cuDNN loaded"
    row = target_build(facts)
    expected = f"cuDNN {row.cudnn}.x or a later {row.cudnn.split('.')[0]}.x"
    tf = facts.tensorflow
    if tf is None:
        return Check("tensorflow.cudnn", title, "skip", TF_SKIPPED, expected)
    found = (
        f"{tf.cudnn.value.version} ({tf.cudnn.value.path})"
        if tf.cudnn.ok and tf.cudnn.value is not None
        else tf.cudnn.text()
    )
    info = tf.build.value if tf.build.ok else None
    if info is None or not info.is_cuda_build or not facts.selected:
        return Check("tensorflow.cudnn", title, "skip", found, expected + " (only with GPUs)")
    fix = (
        f"install cuDNN {row.cudnn}: `pip install 'nvidia-cudnn-cu12=={row.cudnn}.*'` "
        "(part of tensorflow[and-cuda]), or use the image's CUDA/cuDNN base (`make build`)"
    )
    if not tf.cudnn.ok or tf.cudnn.value is None:
        return Check("tensorflow.cudnn", title, "error", found, expected, fix)
    have = compat.version_tuple(tf.cudnn.value.version)
    want = compat.version_tuple(row.cudnn)
    if have[0] != want[0]:
        return Check("tensorflow.cudnn", title, "error",
                     found + ": another major version", expected, fix)
    if have[:2] < want:
        return Check("tensorflow.cudnn", title, "warn", found + ": older than the build's",
                     expected, fix)
    return Check("tensorflow.cudnn", title, "ok", found, expected)


def expected_tf_gpus(facts: Facts) -> tuple[int, str] | None:
    """How many GPUs TensorFlow should list, and why; None when GPUS did not fit."""
    selection = facts.selection
    if selection is None:
        return None
    if selection.cuda_visible_devices is not None:
        return len(selection.gpus), (
            f"GPUS={facts.request} -> CUDA_VISIBLE_DEVICES={selection.cuda_visible_devices}"
        )
    preset = facts.environ.get("CUDA_VISIBLE_DEVICES")
    if preset is None:
        return len(selection.gpus), f"GPUS={facts.request}"
    return len(visible_gpus(preset, facts.gpus)), f"GPUS=all, CUDA_VISIBLE_DEVICES={preset!r}"


def check_tf_devices(facts: Facts) -> Check:
    title = "TensorFlow GPUs"
    tf = facts.tensorflow
    wanted = expected_tf_gpus(facts)
    expected = f"{wanted[0]} ({wanted[1]})" if wanted else "GPUS fits the machine"
    if tf is None:
        return Check("visible.tensorflow", title, "skip", TF_SKIPPED, expected)
    if not tf.gpus.ok or tf.gpus.value is None:
        return Check("visible.tensorflow", title, "error", tf.gpus.text(), expected,
                     "see the TensorFlow build line above")
    names = ", ".join(tf.gpus.value) or "none"
    found = f"Num GPUs Available: {len(tf.gpus.value)} ({names})"
    if wanted is None:
        return Check("visible.tensorflow", title, "skip", found, expected)
    if len(tf.gpus.value) == wanted[0]:
        return Check("visible.tensorflow", title, "ok", found, expected)
    info = tf.build.value if tf.build.ok else None
    if info is not None and not info.is_cuda_build:
        fix = "TensorFlow is a CPU-only build: see the TensorFlow build line"
    elif len(tf.gpus.value) < wanted[0]:
        fix = (
            "TensorFlow could not open every GPU: check the driver and cuDNN lines above, "
            "then run `TF_CPP_MIN_LOG_LEVEL=0 mgpu doctor` to read TensorFlow's own reason"
        )
    else:
        fix = "unset CUDA_VISIBLE_DEVICES and choose the GPUs with GPUS=..."
    return Check(
        "visible.tensorflow", title, "error",
        f"TensorFlow lists {len(tf.gpus.value)} GPU(s) but {wanted[1]} asks for {wanted[0]}; "
        + found,
        expected, fix,
    )


# -------------------------------------------------------------------------------- GPUs


def check_gpu(facts: Facts, gpu: GpuInfo) -> Check:
    """One GPU: name, UUID, memory, compute capability vs the build, MIG."""
    title = f"GPU {gpu.index}"
    selected = any(g.index == gpu.index for g in facts.selected)
    parts = [gpu.name, gpu.uuid or "no UUID"]
    if gpu.memory_total_mib.ok and gpu.memory_free_mib.ok:
        parts.append(
            f"{(gpu.memory_free_mib.value or 0) / 1024:.1f} of "
            f"{(gpu.memory_total_mib.value or 0) / 1024:.1f} GiB free"
        )
    else:
        parts.append(f"memory {gpu.memory_total_mib.text()}")
    cc = gpu.compute_capability
    parts.append(f"compute capability {_cc_text(cc.value)}" if cc.ok and cc.value
                 else f"compute capability {cc.text()}")
    if gpu.mig_enabled.ok:
        parts.append("MIG on" if gpu.mig_enabled.value else "MIG off")
    elif _is_not_supported(gpu.mig_enabled):
        parts.append("no MIG")
    else:
        parts.append(f"MIG {gpu.mig_enabled.text()}")
    if cc.ok and cc.value:
        fp16 = "yes" if cc.value >= (7, 0) else "no"
        bf16 = "yes" if cc.value >= (8, 0) else "no"
        parts.append(f"FP16 tensor cores: {fp16}, bf16: {bf16}")
    if not selected:
        parts.append(f"not used (GPUS={facts.request})")
    found = "; ".join(parts)

    build = facts.tensorflow.build.value if facts.tensorflow and facts.tensorflow.build.ok else None
    capabilities = build.compute_capabilities if build and build.is_cuda_build else ()
    expected = (
        "compute capability in the build (" + ", ".join(capabilities) + "), MIG off"
        if capabilities else "MIG off; compute capability >= 7.0 for mixed precision"
    )
    problems: list[tuple[Status, str]] = []
    if cc.ok and cc.value and capabilities:
        support = capability_support(cc.value, capabilities)
        if support == "none":
            problems.append((
                "error",
                f"this TensorFlow has no code for compute capability {_cc_text(cc.value)}: "
                "use another GPU (GPUS=...) or a TensorFlow built for it",
            ))
        elif support == "ptx":
            problems.append((
                "warn",
                "the build has only PTX for this GPU: the first start compiles kernels for "
                "minutes (keep the cache: CUDA_CACHE_MAXSIZE=4294967296)",
            ))
    elif not cc.ok:
        problems.append(("warn", "compute capability could not be read: run `nvidia-smi -q`"))
    if gpu.mig_enabled.ok and gpu.mig_enabled.value:
        problems.append((
            "warn",
            "with MIG on, a CUDA process sees one MIG instance and cannot all-reduce across "
            f"instances: disable it (`sudo nvidia-smi -i {gpu.index} -mig 0`, then reset the "
            "GPU) for multi-GPU training",
        ))
    total, free = gpu.memory_total_mib.value, gpu.memory_free_mib.value
    if total and free is not None and free < 0.1 * total:
        problems.append((
            "warn",
            "less than 10% of its memory is free: `nvidia-smi` shows which process holds it",
        ))
    if not problems:
        return Check(f"gpu.{gpu.index}", title, "ok", found, expected)
    status: Status = "error" if any(s == "error" for s, _ in problems) else "warn"
    if not selected:
        status = "ok"  # a GPU this run does not use cannot stop it
    return Check(f"gpu.{gpu.index}", title, status, found, expected,
                 "; ".join(text for _, text in problems))


def check_mixed_precision(facts: Facts) -> Check:
    title = "Mixed precision"
    mode = facts.mixed_precision
    selected = [g for g in facts.selected if g.compute_capability.ok and g.compute_capability.value]
    fp16 = [g.index for g in selected if (g.compute_capability.value or (0, 0)) >= (7, 0)]
    bf16 = [g.index for g in selected if (g.compute_capability.value or (0, 0)) >= (8, 0)]
    found = (
        f"MIXED_PRECISION={mode}; FP16 tensor cores: {_indices(fp16)}, bf16: {_indices(bf16)}"
        if facts.selected else f"MIXED_PRECISION={mode}; no GPU selected (CPU)"
    )
    expected = "fp16 needs compute capability >= 7.0, bf16 >= 8.0 on every GPU used"
    if not facts.selected:
        if mode == "fp16":
            return Check("gpu.mixed_precision", title, "warn", found, expected,
                         "fp16 on the CPU is slower than float32: MIXED_PRECISION=bf16 or 0")
        return Check("gpu.mixed_precision", title, "ok", found, expected)
    count = len(facts.selected)
    if mode in ("1", "fp16") and len(fp16) < count:
        slow = [g.index for g in facts.selected if g.index not in fp16]
        return Check("gpu.mixed_precision", title, "warn", found, expected,
                     f"{_indices(slow)}: no FP16 tensor cores: fp16 will not be faster; "
                     "MIXED_PRECISION=0")
    if mode == "bf16" and len(bf16) < count:
        slow = [g.index for g in facts.selected if g.index not in bf16]
        return Check("gpu.mixed_precision", title, "warn", found, expected,
                     f"{_indices(slow)}: no bf16 support (needs 8.0): MIXED_PRECISION=fp16")
    if mode == "0" and len(fp16) == count:
        return Check("gpu.mixed_precision", title, "ok", found, expected,
                     "MIXED_PRECISION=1 would use the tensor cores (the seed's FP16 tip)")
    return Check("gpu.mixed_precision", title, "ok", found, expected)


def check_uniform(facts: Facts) -> Check:
    title = "Same GPU model"
    expected = "every GPU used has the same model (MirroredStrategy waits for the slowest)"
    if len(facts.selected) < 2:
        return Check("gpu.uniform", title, "skip", f"{len(facts.selected)} GPU(s) used", expected)
    kinds = {(g.name, g.compute_capability.value) for g in facts.selected}
    found = _gpu_names(facts.selected)
    if len(kinds) == 1:
        return Check("gpu.uniform", title, "ok", found, expected)
    return Check("gpu.uniform", title, "warn", found, expected,
                 "every step waits for the slowest GPU: choose identical GPUs with GPUS=...")


def _link_text(link: GpuLink) -> str:
    topology = link.topology.value if link.topology.ok else "topology unknown"
    if link.nvlink.ok and link.nvlink.value:
        via = "NVLink"
    elif link.p2p_read.ok:
        via = "P2P" if link.p2p_read.value else "no P2P"
    else:
        via = "P2P unknown"
    return f"{link.a}-{link.b}: {topology}, {via}"


def check_topology(facts: Facts) -> Check:
    title = "GPU links"
    expected = "NVLink, or P2P through one PCIe switch or host bridge"
    chosen = {g.index for g in facts.selected}
    if len(chosen) < 2:
        return Check("gpu.topology", title, "skip", f"{len(chosen)} GPU(s) used", expected)
    links = [lk for lk in facts.nvml.links if lk.a in chosen and lk.b in chosen]
    found = "; ".join(_link_text(lk) for lk in links) or "no link information"
    slow, unknown = [], []
    for link in links:
        nvlink = link.nvlink.ok and link.nvlink.value
        if not link.topology.ok and not link.p2p_read.ok and not link.nvlink.ok:
            unknown.append(link)
        elif not nvlink and (
            (link.p2p_read.ok and not link.p2p_read.value)
            or (link.topology.ok and link.topology.value == "across CPU sockets")
        ):
            slow.append(link)
    if slow:
        pairs = ", ".join(f"{lk.a}-{lk.b}" for lk in slow)
        return Check("gpu.topology", title, "warn", found, expected,
                     f"all-reduce between {pairs} goes through host memory and will be slow. "
                     + NCCL_HINTS)
    if unknown or not links:
        return Check("gpu.topology", title, "warn", found, expected,
                     "run `nvidia-smi topo -m` to see the links")
    return Check("gpu.topology", title, "ok", found, expected)


# --------------------------------------------------------------------- visible devices


def check_request(facts: Facts) -> Check:
    title = "GPUS request"
    count = len(facts.gpus)
    expected = (
        f"all, none, indices 0..{count - 1} or UUIDs of these GPUs" if count
        else "all or none (no GPU here)"
    )
    if facts.selection_error is not None or facts.selection is None:
        return Check(
            "visible.request", title, "error",
            f"GPUS={facts.request}: {facts.selection_error}", expected,
            "set GPUS=all, GPUS=none, or indices/UUIDs that `nvidia-smi -L` lists",
            bad_setting=True,
        )
    selection = facts.selection
    if facts.request.kind == "none":
        return Check("visible.request", title, "ok", "GPUS=none: training uses the CPU", expected)
    if selection.uses_cpu and not facts.nvml.listing.available:
        # The driver line is the cause and already says training will use the CPU.
        return Check("visible.request", title, "skip",
                     f"GPUS={facts.request}: no GPU, training will use the CPU"
                     + SAME_CAUSE_AS_NVML, expected)
    if selection.uses_cpu:
        return Check(
            "visible.request", title, "warn",
            f"GPUS={facts.request}: no GPU, training will use the CPU", expected,
            _nvml_fix(facts) if not facts.nvml.listing.available else
            "check the driver lines above; GPUS=none silences this",
        )
    found = f"GPUS={facts.request} -> {_gpu_names(selection.gpus)}"
    if selection.note:
        found += f" ({selection.note})"
    return Check("visible.request", title, "ok", found, expected)


def check_visibility_env(facts: Facts) -> Check:
    title = "Visible devices"
    env = facts.environ
    shown = [
        f"{name}={env[name]!r}" if name in env else f"{name} unset"
        for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    ]
    found = ", ".join(shown)
    expected = "unset, or agreeing with GPUS (mgpu sets CUDA_DEVICE_ORDER=PCI_BUS_ID itself)"
    selection = facts.selection
    if selection is not None and selection.cuda_visible_devices is not None:
        found += f"; mgpu sets CUDA_VISIBLE_DEVICES={selection.cuda_visible_devices!r}"
    preset = env.get("CUDA_VISIBLE_DEVICES")
    if (
        facts.request.kind == "all" and preset is not None and facts.gpus
        and len(visible_gpus(preset, facts.gpus)) == 0
    ):
        return Check("visible.environment", title, "warn", found, expected,
                     f"CUDA_VISIBLE_DEVICES={preset!r} hides every GPU although NVML sees "
                     f"{len(facts.gpus)}: unset it (GPUS chooses the GPUs)")
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower()
    if nvidia in ("void", "none") and _wants_gpus(facts) and not facts.gpus:
        return Check("visible.environment", title, "warn", found, expected,
                     "NVIDIA_VISIBLE_DEVICES hides the GPUs from the container: set it to all")
    return Check("visible.environment", title, "ok", found, expected)


# ---------------------------------------------------------------------------- container


def check_shm(facts: Facts) -> Check:
    title = "/dev/shm size"
    expected = "more than Docker's 64 MiB default (1 GiB or more for multi-GPU)"
    shm = facts.host.shm_bytes
    if not shm.ok or shm.value is None:
        return Check("container.shm", title, "warn", shm.text(), expected)
    found = f"{shm.value / MIB:.0f} MiB"
    if shm.value <= DOCKER_DEFAULT_SHM:
        return Check("container.shm", title, "warn", found, expected,
                     "compose: `shm_size: 1gb` (or `ipc: host`) on the service; docker run: "
                     "--shm-size=1g (NCCL and tf.data use shared memory)")
    return Check("container.shm", title, "ok", found, expected)


def check_memlock(facts: Facts) -> Check:
    title = "memlock limit"
    expected = "unlimited (CUDA and NCCL pin host memory)"
    memlock = facts.host.memlock
    if not memlock.ok or memlock.value is None:
        return Check("container.memlock", title, "warn", memlock.text(), expected)
    soft, hard = memlock.value
    as_text = lambda v: "unlimited" if v == UNLIMITED else f"{v / MIB:g} MiB"  # noqa: E731
    found = f"soft {as_text(soft)}, hard {as_text(hard)}"
    if soft == UNLIMITED:
        return Check("container.memlock", title, "ok", found, expected)
    if not facts.selected:
        return Check("container.memlock", title, "ok", found + " (no GPU used)", expected)
    return Check("container.memlock", title, "warn", found, expected,
                 "compose: `ulimits: {memlock: -1}`; docker run: --ulimit memlock=-1 "
                 "(outside a container: `ulimit -l unlimited` via /etc/security/limits.conf)")


def check_user(facts: Facts) -> Check:
    title = "User"
    expected = "a non-root user"
    euid = facts.host.euid
    if not euid.ok or euid.value is None:
        return Check("container.user", title, "warn", euid.text(), expected)
    if euid.value != 0:
        return Check("container.user", title, "ok", f"uid {euid.value}", expected)
    in_container = bool(facts.host.in_container.value)
    fix = (
        "files written to mounted folders (runs/) will belong to root: compose "
        '`HOST_UID=$(id -u) HOST_GID=$(id -g) docker compose run ...` (the `make docker-*` '
        'targets set them), or drop `--user root`'
        if in_container else "training needs no root: run as your own user"
    )
    return Check("container.user", title, "warn", "root (uid 0)", expected, fix)


# ----------------------------------------------------------------------------- versions


def check_versions(facts: Facts) -> Check:
    title = "Versions"
    row = target_build(facts)
    versions = facts.versions
    found = ", ".join(f"{name} {probed.text()}" for name, probed in versions.items())
    expected = (
        f"Python {row.python_range} for TensorFlow {row.tensorflow}; Keras 3; "
        f"TensorFlow {compat.PINNED_TENSORFLOW} (requirements.lock)"
    )
    problems: list[tuple[Status, str]] = []
    tf_version = versions.get("TensorFlow", Probed())
    python = versions.get("Python", Probed())
    if not tf_version.ok or not tf_version.value:
        problems.append(
            ("error", "TensorFlow is not installed: `pip install -r requirements.lock`")
        )
    elif compat.for_tensorflow(tf_version.value) is None:
        problems.append(("warn", f"TensorFlow {tf_version.value} has no row in "
                                 "mgpu_env/hardware/compat.py: install the pinned version"))
    elif compat.minor_of(tf_version.value) != compat.PINNED_TENSORFLOW:
        problems.append(("warn", f"TensorFlow {tf_version.value} is not the pinned "
                                 f"{compat.PINNED_TENSORFLOW}: `pip install -r requirements.lock`"))
    if python.ok and python.value and not row.supports_python(python.value):
        problems.append(("error", f"Python {python.value} is outside {row.python_range}: use a "
                                  "supported Python (the image ships one)"))
    keras = versions.get("Keras", Probed())
    if keras.ok and keras.value and not keras.value.startswith("3."):
        problems.append(("warn", f"Keras {keras.value} is not Keras 3: "
                                 "`pip install -r requirements.lock`"))
    if not problems:
        return Check("versions", title, "ok", found, expected)
    status: Status = "error" if any(s == "error" for s, _ in problems) else "warn"
    return Check("versions", title, status, found, expected, "; ".join(t for _, t in problems))


# ------------------------------------------------------------------------------- all


def gpu_checks(facts: Facts) -> list[Check]:
    return [check_gpu(facts, gpu) for gpu in facts.gpus]


ALL_CHECKS: tuple[Callable[[Facts], Check | list[Check]], ...] = (
    check_nvml,
    check_driver_version,
    check_driver_cuda,
    check_device_files,
    check_tf_build,
    check_cudnn,
    check_versions,
    gpu_checks,
    check_mixed_precision,
    check_uniform,
    check_topology,
    check_request,
    check_visibility_env,
    check_tf_devices,
    check_shm,
    check_memlock,
    check_user,
)


def run_checks(
    facts: Facts, checks: Iterable[Callable[[Facts], Check | list[Check]]] = ALL_CHECKS
) -> list[Check]:
    """Every check, in report order. A check that raises becomes a warning, not a crash."""
    results: list[Check] = []
    for check in checks:
        try:
            outcome = check(facts)
        except Exception as err:
            name = getattr(check, "__name__", "check")
            results.append(Check(name, name, "warn", f"could not collect ({err!r})"))
            continue
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results
