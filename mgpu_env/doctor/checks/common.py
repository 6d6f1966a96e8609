"""What every check shares: the `Check` record, its status and small helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import compat
from mgpu_env.hardware.devices import visible_gpus
from mgpu_env.hardware.nvml import GpuInfo, Probed

Status = Literal["ok", "warn", "error", "skip"]
CheckFunction = Callable[[Facts], "Check | list[Check]"]
MIB = 1024 * 1024
TF_SKIPPED = "skipped (--no-tf)"

FIX_DRIVER_IN_CONTAINER = (
    "start the container with the GPUs: `docker run --gpus all ...`, or in compose "
    "`gpus: all` (or deploy.resources.reservations.devices with driver nvidia); the host "
    "needs the NVIDIA driver and the NVIDIA Container Toolkit "
    "(`sudo nvidia-ctk runtime configure --runtime=docker` and restart Docker)"
)
FIX_GPU_COMPOSE = (
    "this machine gives the container no GPU, so docker-compose.gpu.yml cannot be used here: "
    "set `COMPOSE_FILE=docker-compose.yml` in .env (CPU only), or install the NVIDIA driver "
    "and the NVIDIA Container Toolkit "
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
class Registered:
    """A check as `@check` registered it: the id of its line, where it stands in the
    report, and whether `mgpu train`'s pre-flight runs it too."""

    function: CheckFunction
    id: CheckId
    order: int
    preflight: bool


# Every check, by name: filled by `@check` when its topic module is imported (judge.py
# imports them all), so a new check is added in one place, its own module.
REGISTRY: dict[str, Registered] = {}
_Function = TypeVar("_Function", bound=Callable[..., Any])


def check(order: int, id: CheckId, *, preflight: bool = False
          ) -> Callable[[_Function], _Function]:
    """Register a check: `order` is its place in the report (the numbers leave room
    between them), `id` its line's id (its module's `CheckId`, whose calls make the check's
    results); `preflight` puts it in the checks `mgpu train` runs before it starts."""

    def register(function: _Function) -> _Function:
        known = REGISTRY.get(function.__name__)
        if known is not None and known.function.__module__ != function.__module__:
            raise ValueError(f"two checks named {function.__name__}")
        REGISTRY[function.__name__] = Registered(function, id, order, preflight)
        return function

    return register


@dataclass(frozen=True)
class Skipped:
    """Why a skipped check does not apply here. Every check one cause silences (no GPU,
    --no-tf) gives the same reason, so the report can say it once, as
    `skip  9 GPU checks  no GPU (GPUS=all: training uses the CPU)`."""

    kind: str  # what the checks are about, for that line's title: "GPU", "TensorFlow"
    why: str


@dataclass(frozen=True)
class Check:
    """One judged finding. `bad_setting`: the error is a setting the user must change.
    `skipped_for`: a skip's shared reason (None: the check's own `found` says why)."""

    id: str
    title: str
    status: Status
    found: str
    expected: str = ""
    fix: str = ""
    bad_setting: bool = False
    skipped_for: Skipped | None = None


@dataclass(frozen=True)
class CheckId:
    """A check's id, declared once, as a constant of its module (`HOST_P2P =
    CheckId("host.p2p")`) that its `@check` names: every result of it is made by calling it
    (`HOST_P2P(title, "ok", found, expected)`), so no return retypes the id, and a mistyped
    constant is a NameError where a mistyped string was a silently new id."""

    value: str

    def __call__(self, title: str, status: Status, found: str, expected: str = "",
                 fix: str = "", bad_setting: bool = False,
                 skipped_for: Skipped | None = None) -> Check:
        return Check(self.value, title, status, found, expected, fix, bad_setting,
                     skipped_for)

    def child(self, part: object) -> CheckId:
        """The id of one of the check's lines per thing (`gpu.health.0`, one per GPU)."""
        return CheckId(f"{self.value}.{part}")


@dataclass(frozen=True)
class SkippedGroup:
    """Two or more checks skipped for one reason, reported as one line."""

    reason: Skipped
    checks: tuple[Check, ...]

    @property
    def title(self) -> str:
        return f"{len(self.checks)} {self.reason.kind} checks"


TF_NOT_PROBED = Skipped("TensorFlow", "not probed (--no-tf)")


def no_gpu(facts: Facts) -> Skipped:
    """The one reason every GPU-only check gives when the run has no GPU."""
    if not wants_gpus(facts):
        why = "GPUS=none: training uses the CPU"
    elif not facts.nvml.listing.available:
        why = "no GPU driver (NVML): training uses the CPU"
    elif not facts.gpus:
        why = f"no GPU (GPUS={facts.request}: training uses the CPU)"
    else:
        why = f"no GPU selected (GPUS={facts.request}): training uses the CPU"
    return Skipped("GPU", why)


def fewer_than_two_gpus(facts: Facts) -> Skipped:
    """Why the checks between GPUs (sameness, links, NCCL) do not apply."""
    if not facts.selected:
        return no_gpu(facts)
    return Skipped("multi-GPU", "one GPU used: nothing to compare or all-reduce")


def group_skipped(checks: Iterable[Check]) -> list[Check | SkippedGroup]:
    """The checks in report order, except that those skipped for a shared reason (two or
    more) become one group each, after the checks that apply."""
    checks = list(checks)
    members: dict[Skipped, list[Check]] = {}
    for check in checks:
        if check.status == "skip" and check.skipped_for is not None:
            members.setdefault(check.skipped_for, []).append(check)
    grouped = {reason for reason, group in members.items() if len(group) > 1}
    rows: list[Check | SkippedGroup] = [
        c for c in checks if c.skipped_for not in grouped or c.status != "skip"
    ]
    rows += [SkippedGroup(reason, tuple(members[reason])) for reason in members
             if reason in grouped]
    return rows


def target_build(facts: Facts) -> compat.TfBuild:
    """The table row for the TensorFlow installed here, else the pinned one."""
    version = facts.versions.get("TensorFlow", Probed())
    if facts.tensorflow is not None and facts.tensorflow.version.ok:
        version = facts.tensorflow.version
    row = compat.for_tensorflow(version.value) if version.ok and version.value else None
    return row or compat.pinned()


def gpu_compose_file(facts: Facts) -> bool:
    """Whether the container was started with docker-compose.gpu.yml (MGPU_COMPOSE_GPU=1)."""
    return facts.environ.get("MGPU_COMPOSE_GPU", "").strip() == "1"


def nvml_fix(facts: Facts) -> str:
    if gpu_compose_file(facts):
        return FIX_GPU_COMPOSE
    return FIX_DRIVER_IN_CONTAINER if facts.host.in_container.value else FIX_DRIVER_ON_HOST


def gpu_names(gpus: Iterable[GpuInfo]) -> str:
    return ", ".join(f"GPU {g.index} ({g.name})" for g in gpus) or "none"


def wants_gpus(facts: Facts) -> bool:
    return facts.request.kind != "none"


def is_not_supported(probed: Probed[Any]) -> bool:
    return not probed.ok and "not supported" in (probed.error or "").lower()


def indices_text(indices: list[int]) -> str:
    if not indices:
        return "none"
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def limit_text(value: int) -> str:
    """An rlimit in bytes as text; -1 is unlimited."""
    return "unlimited" if value == -1 else f"{value / MIB:g} MiB"


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
