"""The doctor's checks of the GPUs.

Each GPU is checked against the build and mixed precision, the GPUs against each other
(sameness), and the links between them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

from mgpu_env.doctor.checks.common import (
    NCCL_HINTS,
    Check,
    CheckId,
    Status,
    cc_text,
    check,
    fewer_than_two_gpus,
    gpu_names,
    indices_text,
    is_not_supported,
)
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import compat
from mgpu_env.hardware.nvml import GpuInfo, GpuLink
from mgpu_env.runtime.precision import FLOAT32, MIXED_FLOAT16, fp16_tensor_cores, runs_bf16

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
GPU = CheckId("gpu")
GPU_MIXED_PRECISION = CheckId("gpu.mixed_precision")
GPU_UNIFORM = CheckId("gpu.uniform")
GPU_TOPOLOGY = CheckId("gpu.topology")


# Turing boards without tensor cores: the GTX 16 series (TU116/TU117) and the MX 4xx/5xx
# laptop chips. Their compute capability is 7.5, like an RTX 2080's.
_NO_TENSOR_CORES = re.compile(r"GTX\s*16\d\d|\bMX\s*[45]\d\d\b", re.I)
# A Blackwell GPU (compute capability 10.x, 12.x) under TensorFlow 2.21's wheel: no machine
# code for it, and its PTX does not run there: kernels fail with CUDA_ERROR_INVALID_PTX and
# then CUDA_ERROR_INVALID_HANDLE (tensorflow#97387, #99592, #89272, #101746); XLA emits PTX
# 8.5, which cannot target sm_120 (tensorflow#111958). A newer ptxas does not cure either.
FIX_BLACKWELL = (
    "TensorFlow 2.21's pip wheel cannot run on Blackwell GPUs (compute capability 10.x/12.x): "
    "its kernels fail with CUDA_ERROR_INVALID_PTX; use NVIDIA's NGC TensorFlow container "
    "(nvcr.io/nvidia/tensorflow, a release built with CUDA 12.8 or later), or train on other "
    "GPUs (GPUS=...) or the CPU (GPUS=none)"
)


def has_tensor_cores(gpu: GpuInfo) -> bool:
    """FP16 tensor cores by compute capability and board: a GTX 1660 Ti is 7.5 without them."""
    cc = gpu.compute_capability.value if gpu.compute_capability.ok else None
    return fp16_tensor_cores(cc) and not _NO_TENSOR_CORES.search(gpu.name)


def _tf_version(facts: Facts) -> str | None:
    tf = facts.tensorflow
    if tf is not None and tf.version.ok:
        return tf.version.value
    version = facts.versions.get("TensorFlow")
    return version.value if version is not None and version.ok else None


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




def check_gpu(facts: Facts, gpu: GpuInfo) -> Check:
    """One GPU: name, UUID, memory, compute capability vs the build, MIG."""
    title = f"GPU {gpu.index}"
    selected = any(g.index == gpu.index for g in facts.selected)
    found = _describe_gpu(gpu)
    if not selected:
        found += f"; not used (GPUS={facts.request})"
    build = facts.tensorflow.build.value if facts.tensorflow and facts.tensorflow.build.ok else None
    capabilities = (
        compat.build_capabilities(_tf_version(facts), build.compute_capabilities)
        if build and build.is_cuda_build else ()
    )
    expected = (
        "compute capability in the build (" + ", ".join(capabilities) + "), MIG off"
        if capabilities else "MIG off; compute capability >= 7.0 for mixed precision"
    )
    problems = _gpu_problems(gpu, capabilities)
    if not problems:
        return GPU.child(gpu.index)(title, "ok", found, expected)
    status: Status = "error" if any(s == "error" for s, _ in problems) else "warn"
    if not selected:
        status = "ok"  # a GPU this run does not use cannot stop it
    return GPU.child(gpu.index)(title, status, found, expected,
                     "; ".join(text for _, text in problems))


def _describe_gpu(gpu: GpuInfo) -> str:
    """What NVML says of one GPU, on one line: name, UUID, memory, capability, MIG, ..."""
    parts = [gpu.name, gpu.uuid or "no UUID"]
    if gpu.memory_total_mib.ok and gpu.memory_free_mib.ok:
        parts.append(
            f"{(gpu.memory_free_mib.value or 0) / 1024:.1f} of "
            f"{(gpu.memory_total_mib.value or 0) / 1024:.1f} GiB free"
        )
    else:
        parts.append(f"memory {gpu.memory_total_mib.text()}")
    cc = gpu.compute_capability
    parts.append(f"compute capability {cc_text(cc.value)}" if cc.ok and cc.value
                 else f"compute capability {cc.text()}")
    if gpu.mig_enabled.ok:
        parts.append("MIG on" if gpu.mig_enabled.value else "MIG off")
    elif is_not_supported(gpu.mig_enabled):
        parts.append("no MIG")
    else:
        parts.append(f"MIG {gpu.mig_enabled.text()}")
    if gpu.architecture.ok and gpu.architecture.value:
        parts.append(gpu.architecture.value)
    if cc.ok and cc.value:
        fp16 = "yes" if has_tensor_cores(gpu) else "no"
        bf16 = "yes" if runs_bf16(cc.value) else "no"
        parts.append(f"FP16 tensor cores: {fp16}, bf16: {bf16}")
    if gpu.compute_mode.ok and gpu.compute_mode.value not in (None, "default"):
        parts.append(f"compute mode {gpu.compute_mode.value}")
    return "; ".join(parts)


def _gpu_problems(gpu: GpuInfo, capabilities: Sequence[str]) -> list[tuple[Status, str]]:
    """What is wrong with one GPU for training, each with its status and fix."""
    problems = _capability_problems(gpu, capabilities) + _compute_mode_problems(gpu)
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
    return problems


def _capability_problems(gpu: GpuInfo, capabilities: Sequence[str]) -> list[tuple[Status, str]]:
    """The GPU's compute capability against the ones TensorFlow was built for."""
    cc = gpu.compute_capability
    if not cc.ok:
        return [("warn", "compute capability could not be read: run `nvidia-smi -q`")]
    if not cc.value or not capabilities:
        return []
    support = capability_support(cc.value, capabilities)
    if support == "none":
        return [(
            "error",
            f"this TensorFlow has no code for compute capability {cc_text(cc.value)}: "
            "use another GPU (GPUS=...) or a TensorFlow built for it",
        )]
    if cc.value[0] >= 10:
        return [("error", FIX_BLACKWELL)]
    if support == "ptx":
        return [(
            "warn",
            "the build has only PTX for this GPU: the first start compiles kernels for "
            "minutes (keep the cache: CUDA_CACHE_MAXSIZE=4294967296)",
        )]
    return []


def _compute_mode_problems(gpu: GpuInfo) -> list[tuple[Status, str]]:
    """A compute mode in which TensorFlow cannot open the GPU (CUDA_ERROR_DEVICE_UNAVAILABLE:
    tensorflow#48558, #526)."""
    mode = gpu.compute_mode.value if gpu.compute_mode.ok else None
    busy = gpu.processes.value if gpu.processes.ok and gpu.processes.value else 0
    reset = f"`sudo nvidia-smi -i {gpu.index} -c DEFAULT`"
    if mode == "prohibited":
        return [("error", f"compute is prohibited on this GPU: {reset}")]
    if mode == "exclusive_thread":
        return [("error", "exclusive-thread compute mode, which TensorFlow cannot use: "
                          f"{reset}")]
    if mode == "exclusive_process" and busy:
        return [("error", f"exclusive-process mode and {busy} process(es) already use it "
                          "(all CUDA-capable devices are busy or unavailable): stop them "
                          f"(`nvidia-smi` lists them), choose other GPUs, or {reset}")]
    return []


@check(190, GPU_MIXED_PRECISION)
def check_mixed_precision(facts: Facts) -> Check:
    """MIXED_PRECISION judged by the precision training decided (`facts.precision`, by
    `choose_precision`): what it refused is an error here too; a request it turned into
    float32, or fp16 where MIXED_PRECISION=1 would not pick it, is a warning."""
    title = "Mixed precision"
    mode = facts.mixed_precision
    known = [g for g in facts.selected if g.compute_capability.ok and g.compute_capability.value]
    fp16 = [g.index for g in known if has_tensor_cores(g)]
    bf16 = [g.index for g in known if runs_bf16(g.compute_capability.value)]
    found = (
        f"MIXED_PRECISION={mode}; FP16 tensor cores: {indices_text(fp16)}, "
        f"bf16: {indices_text(bf16)}"
        if facts.selected else f"MIXED_PRECISION={mode}; no GPU selected (CPU)"
    )
    expected = "a precision mgpu train accepts on these devices, and one that is faster"
    choice = facts.precision
    if facts.precision_error is not None:
        # A precision these GPUs cannot run is a bad setting: exit 2, as `mgpu train` exits.
        err = facts.precision_error
        return GPU_MIXED_PRECISION(title, "error", found + f" -> {err}", expected,
                                   err.split("Fix: ", 1)[-1].strip(), bad_setting=True)
    if choice is None:
        return GPU_MIXED_PRECISION(
            title, "skip", f"MIXED_PRECISION={mode}: not decided, GPUS does not fit this "
            "machine (the GPUS request line says why)", expected)
    found += f" -> {choice.policy}: {choice.reason}"
    if mode != "0" and choice.policy == FLOAT32:
        return GPU_MIXED_PRECISION(
            title, "warn", found, expected,
            "mgpu train will use float32 here: set MIXED_PRECISION=0 to say so")
    boards = [g for g in facts.selected
              if fp16_tensor_cores(g.compute_capability.value) and not has_tensor_cores(g)]
    if choice.policy == MIXED_FLOAT16 and boards:
        names = ", ".join(f"GPU {g.index} ({g.name})" for g in boards)
        return GPU_MIXED_PRECISION(
            title, "warn",
            found + f"; {names} has no tensor cores", expected,
            f"{names}: a GeForce GTX 16xx/MX board has no tensor cores, and fp16 is "
            "slower than float32 there (tensorflow#44191): set MIXED_PRECISION=0")
    if choice.policy == MIXED_FLOAT16 and not facts.selected \
            and choice.fastest != MIXED_FLOAT16:
        return GPU_MIXED_PRECISION(
            title, "warn", found, expected,
            f"fp16 on the CPU is slower than float32: MIXED_PRECISION=1 picks "
            f"{choice.fastest} there (or 0)")
    slow = [g.index for g in facts.selected if not fp16_tensor_cores(g.compute_capability.value)]
    if choice.policy == MIXED_FLOAT16 and slow:
        return GPU_MIXED_PRECISION(
            title, "warn", found, expected,
            f"{indices_text(slow)}: no FP16 tensor cores (MIXED_PRECISION=1 "
            "picks float32 there): fp16 will not be faster; MIXED_PRECISION=0")
    if mode == "0" and facts.selected and not boards and choice.fastest == MIXED_FLOAT16:
        return GPU_MIXED_PRECISION(
            title, "ok", found, expected,
            "MIXED_PRECISION=1 would use the tensor cores (the tutorial's FP16 tip)")
    return GPU_MIXED_PRECISION(title, "ok", found, expected)


@check(200, GPU_UNIFORM)
def check_uniform(facts: Facts) -> Check:
    title = "Same GPU model"
    expected = "every GPU used has the same model (MirroredStrategy waits for the slowest)"
    if len(facts.selected) < 2:
        return GPU_UNIFORM(title, "skip", f"{len(facts.selected)} GPU(s) used", expected,
                           skipped_for=fewer_than_two_gpus(facts))
    kinds = {(g.name, g.compute_capability.value) for g in facts.selected}
    found = gpu_names(facts.selected)
    memory = {g.memory_total_mib.value for g in facts.selected if g.memory_total_mib.ok}
    if len(kinds) == 1 and len(memory) <= 1:
        return GPU_UNIFORM(title, "ok", found, expected)
    if len(kinds) == 1:
        # Same model, different memory (40 and 80 GB boards of one name, a MIG slice):
        # every replica's batch must fit the smallest.
        sizes = ", ".join(f"GPU {g.index}: {g.memory_total_mib.value} MiB"
                          for g in facts.selected if g.memory_total_mib.ok)
        return GPU_UNIFORM(title, "warn", f"{found}; memory {sizes}", expected,
                           "every replica's batch must fit the smallest GPU: choose GPUs of one "
                           "memory size with GPUS=...")
    return GPU_UNIFORM(title, "warn", found, expected,
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


@check(210, GPU_TOPOLOGY)
def check_topology(facts: Facts) -> Check:
    title = "GPU links"
    expected = "NVLink, or P2P through one PCIe switch or host bridge"
    chosen = {g.index for g in facts.selected}
    if len(chosen) < 2:
        return GPU_TOPOLOGY(title, "skip", f"{len(chosen)} GPU(s) used", expected,
                            skipped_for=fewer_than_two_gpus(facts))
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
        return GPU_TOPOLOGY(
            title, "warn", found, expected,
            f"all-reduce between {pairs} goes through host memory and will be slow. "
            + NCCL_HINTS)
    if unknown or not links:
        return GPU_TOPOLOGY(title, "warn", found, expected,
                            "run `nvidia-smi topo -m` to see the links")
    return GPU_TOPOLOGY(title, "ok", found, expected)


@check(170, GPU, preflight=True)
def gpu_checks(facts: Facts) -> list[Check]:
    return [check_gpu(facts, gpu) for gpu in facts.gpus]
