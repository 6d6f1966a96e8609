"""The container's view of the GPUs, as the NVIDIA Container Toolkit set it up.

Which driver capabilities it mounted (`NVIDIA_DRIVER_CAPABILITIES`: training needs `compute`,
which is libcuda.so.1; `utility` is NVML and nvidia-smi), and which GPUs it was asked to give
(`NVIDIA_VISIBLE_DEVICES`: `all`, `none`, `void`, indices, UUIDs, MIG devices).

The toolkit's default for an unset NVIDIA_DRIVER_CAPABILITIES is `utility,compute`; NVIDIA's
CUDA images set `compute,utility` themselves.
"""

from __future__ import annotations

from mgpu_env.config.text import is_digits, whole_number
from mgpu_env.doctor.checks.common import Check, CheckId, Skipped, Status, check, no_gpu, wants_gpus
from mgpu_env.doctor.checks.nvmlcause import gpus_on_machine
from mgpu_env.doctor.facts import Facts

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
CONTAINER_GPUS = CheckId("container.gpus")

TOOLKIT_DEFAULT = "utility,compute"
CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "all")
FIX_COMPUTE = (
    "start the container with NVIDIA_DRIVER_CAPABILITIES=compute,utility (or `all`): without "
    "`compute` the NVIDIA Container Toolkit mounts no libcuda.so.1, so CUDA cannot start "
    "(docker-compose.gpu.yml sets it)"
)
NOT_IN_CONTAINER = Skipped("container", "not in a container")


def capabilities(value: str | None) -> tuple[set[str], list[str]]:
    """The capabilities a value gives (an unset one: the toolkit's default), and the words
    in it the toolkit does not know."""
    words = [w.strip().lower() for w in (value if value is not None else TOOLKIT_DEFAULT)
             .split(",") if w.strip()]
    given = set(CAPABILITIES) if "all" in words else set(words)
    return given, [w for w in words if w not in CAPABILITIES]


def _visible_devices(facts: Facts, value: str) -> tuple[Status, str, str] | None:
    """A problem with NVIDIA_VISIBLE_DEVICES, as (status, what, fix); None when it is fine."""
    text = value.strip().lower()
    if text in ("all", ""):
        return None
    if text in ("none", "void"):
        meaning = ("`none`: no GPU, only the driver's libraries" if text == "none" else
                   "`void`: the toolkit does nothing")
        return ("error" if not facts.gpus else "warn",
                f"NVIDIA_VISIBLE_DEVICES={value} gives the container no GPU ({meaning})",
                "start the container with NVIDIA_VISIBLE_DEVICES=all (or `--gpus all`), or set "
                "GPUS=none to train on the CPU on purpose")
    uuids = {g.uuid.lower() for g in facts.gpus}
    # The host's GPUs by index: as many as the kernel shows, or NVML counts.
    known = max(len(facts.host.nvidia.gpu_bus_ids),
                len(facts.gpus) + len(facts.nvml.listing.failed))
    absent = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        if item.startswith(("gpu-", "mig-")):
            if not any(u.startswith(item) for u in uuids):
                absent.append(item)
        elif is_digits(item.split(":")[0]) and (whole_number(item.split(":")[0]) or 0) >= known:
            absent.append(item)
    if not absent:
        return None
    here = ", ".join(g.uuid for g in facts.gpus) or "none"
    return ("warn", f"NVIDIA_VISIBLE_DEVICES names {', '.join(absent)}, which this "
            f"container does not have (NVML lists {here})",
            "name GPUs the host has (`nvidia-smi -L` on the host lists their indices and "
            "UUIDs), or use NVIDIA_VISIBLE_DEVICES=all and choose with GPUS=")


@check(60, CONTAINER_GPUS)
def check_container_view(facts: Facts) -> Check:
    title = "Container GPUs"
    expected = ("NVIDIA_DRIVER_CAPABILITIES with compute (and utility), "
                "NVIDIA_VISIBLE_DEVICES naming GPUs that are here")
    if not facts.host.in_container.value:
        return CONTAINER_GPUS(title, "skip", "not in a container", expected,
                              skipped_for=NOT_IN_CONTAINER if facts.gpus else no_gpu(facts))
    env = facts.environ
    raw = env.get("NVIDIA_DRIVER_CAPABILITIES")
    given, unknown = capabilities(raw)
    caps_text = raw if raw is not None else f"unset ({TOOLKIT_DEFAULT})"
    shown = (f"NVIDIA_DRIVER_CAPABILITIES={caps_text}, "
             f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES', 'unset')}")
    if not wants_gpus(facts):
        return CONTAINER_GPUS(title, "skip", shown, "not needed with GPUS=none",
                              skipped_for=no_gpu(facts))
    if not facts.gpus and not gpus_on_machine(facts) and "NVIDIA_" not in " ".join(env):
        # A CPU machine's container that asks nothing of the toolkit: nothing to judge.
        return CONTAINER_GPUS(title, "skip", shown, expected,
                              skipped_for=no_gpu(facts))
    if "compute" not in given:
        return CONTAINER_GPUS(title, "error",
                              f"{shown}: no `compute`, so no libcuda.so.1 (training needs it)",
                              expected, FIX_COMPUTE)
    if unknown:
        return CONTAINER_GPUS(
            title, "warn",
            f"{shown}: {', '.join(unknown)} is not a capability the toolkit knows "
            f"(valid: {', '.join(CAPABILITIES)})", expected,
            "remove it from NVIDIA_DRIVER_CAPABILITIES")
    problem = _visible_devices(facts, env.get("NVIDIA_VISIBLE_DEVICES", "all"))
    if problem is not None:
        status, what, fix = problem
        return CONTAINER_GPUS(title, status, f"{shown}: {what}", expected, fix)
    if "utility" not in given:
        return CONTAINER_GPUS(
            title, "warn",
            f"{shown}: no `utility`, so no NVML and no nvidia-smi (mgpu cannot list "
            "the GPUs)", expected,
            "add utility: NVIDIA_DRIVER_CAPABILITIES=compute,utility")
    return CONTAINER_GPUS(title, "ok", shown, expected)
