"""The limits GPUs and NCCL meet, against what this machine's GPU count asks for.

The limits GPUs and NCCL meet: /dev/shm (NCCL's shared-memory segments), locked memory (pinned
host memory, InfiniBand registration) and the stack, each against what this machine's GPU count
asks for (`doctor.demand`).

NVIDIA's containers ask for `--ipc=host` (or a large /dev/shm), `--ulimit memlock=-1` and
`--ulimit stack=67108864` (the NGC containers' start-up banner and their user guide); NCCL's
troubleshooting page names /dev/shm for its `unhandled system error`.
"""

from __future__ import annotations

from mgpu_env.doctor.checks.common import MIB, Check, CheckId, Status, limit_text
from mgpu_env.doctor.checks.processlimits import FIX_UNREADABLE, NOT_PROBED, demand_of, rlimit_of
from mgpu_env.doctor.demand import NVIDIA_STACK, Demand, size_text
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware.limits import MachineLimits

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
CONTAINER_SHM = CheckId("container.shm")
CONTAINER_MEMLOCK = CheckId("container.memlock")
CONTAINER_STACK = CheckId("container.stack")

DOCKER_DEFAULT_SHM = 64 * MIB
FIX_SHM = (
    "compose: `shm_size: 1gb` (or `ipc: host`) on the service; docker run: --shm-size=1g "
    "(NCCL and tf.data use shared memory)"
)
FIX_SHM_MORE = (
    "; this project's compose: SHM_SIZE in .env; Kubernetes: an emptyDir with medium: Memory "
    "mounted at /dev/shm; or NCCL_SHM_DISABLE=1 (NCCL then copies through the network path, "
    "slower)"
)
SHM_FAILURE = (
    "NCCL fails at init: `NCCL WARN Error while creating shared memory segment /dev/shm/nccl-"
    "XXXX (size 9637888)`, then `unhandled system error`"
)


def _without_p2p(facts: Facts) -> bool:
    """Whether NCCL will take the shared-memory path: P2P disabled, or some pair of the GPUs
    used without P2P by NVML."""
    if facts.environ.get("NCCL_P2P_DISABLE", "").strip() == "1":
        return True
    chosen = {g.index for g in facts.selected}
    return any(not (lk.p2p_read.ok and lk.p2p_read.value) for lk in facts.nvml.links
               if lk.a in chosen and lk.b in chosen)


def check_shm(facts: Facts) -> Check:
    title = "/dev/shm size"
    limits = facts.host.limits
    if limits is None:
        return CONTAINER_SHM(title, "skip", "not read", skipped_for=NOT_PROBED)
    demand = demand_of(facts, limits)
    expected = ("more than Docker's 64 MiB default (1 GiB or more for multi-GPU)"
                + (f"; NCCL needs {size_text(demand.shm)} free ({demand.why_shm()})"
                   if demand.shm else ""))
    shm = limits.shm
    if not shm.ok or shm.value is None:
        return CONTAINER_SHM(
            title, "warn", shm.text(), expected,
            "mount a tmpfs at /dev/shm (Docker does; compose `shm_size:`), or make it "
            "readable")
    size, free = shm.value
    found = f"{size / MIB:.0f} MiB, {free / MIB:.0f} MiB free"
    if free < demand.shm:
        status: Status = "error" if _without_p2p(facts) else "warn"
        why = ("" if status == "error" else " (NVML reports P2P between the GPUs: NCCL needs "
               "this only where it falls back to shared memory)")
        return CONTAINER_SHM(title, status, f"{found}: {SHM_FAILURE}{why}", expected,
                             FIX_SHM + FIX_SHM_MORE)
    if size <= DOCKER_DEFAULT_SHM and facts.selected:
        return CONTAINER_SHM(title, "warn", found, expected, FIX_SHM + FIX_SHM_MORE)
    return CONTAINER_SHM(title, "ok", found, expected)


def _memlock_needed(facts: Facts) -> bool:
    """NCCL's InfiniBand transport registers its buffers against RLIMIT_MEMLOCK: across
    workers, with an HCA, and NCCL_IB_DISABLE not set."""
    nccl = facts.nccl
    across = facts.cluster.cluster is not None
    ib_off = facts.environ.get("NCCL_IB_DISABLE", "").strip() == "1"
    return bool(across and nccl is not None and nccl.hcas and not ib_off)


def check_memlock(facts: Facts) -> Check:
    title = "memlock limit"
    expected = "unlimited (CUDA and NCCL pin host memory)"
    limits = facts.host.limits
    if limits is None:
        return CONTAINER_MEMLOCK(title, "skip", "not read", skipped_for=NOT_PROBED)
    memlock = rlimit_of(limits, "memlock")
    if memlock is None:
        return CONTAINER_MEMLOCK(title, "warn", limits.rlimits.text(), expected,
                                 FIX_UNREADABLE)
    found = f"soft {size_text(memlock.soft)}, hard {size_text(memlock.hard)}"
    if memlock.soft is None:
        return CONTAINER_MEMLOCK(title, "ok", found, expected)
    if not facts.selected:
        return CONTAINER_MEMLOCK(title, "ok", found + " (no GPU used)", expected)
    fix = ("compose: `ulimits: {memlock: -1}`; docker run: --ulimit memlock=-1 "
           "(outside a container: `ulimit -l unlimited` via /etc/security/limits.conf; Slurm: "
           "LimitMEMLOCK=infinity in slurmd's unit, or PropagateResourceLimitsExcept=MEMLOCK)")
    if _memlock_needed(facts) and facts.nccl is not None:
        return CONTAINER_MEMLOCK(
            title, "error",
            found + f": NCCL's InfiniBand transport ({', '.join(facts.nccl.hcas)}) "
            "registers its buffers against this limit and fails at init (`NCCL WARN "
            "Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory`, "
            "NVIDIA/nccl-tests#206; NCCL's troubleshooting page, InfiniBand)",
            expected, fix)
    return CONTAINER_MEMLOCK(title, "warn", found, expected, fix)


def check_stack(facts: Facts) -> Check:
    title = "stack limit"
    limits = facts.host.limits
    if limits is None:
        return CONTAINER_STACK(title, "skip", "not read", skipped_for=NOT_PROBED)
    return _stack(limits, demand_of(facts, limits))


def _stack(limits: MachineLimits, demand: Demand) -> Check:
    title = "stack limit"
    expected = (f"{NVIDIA_STACK // MIB} MiB or more, or unlimited (NVIDIA's recommended "
                "`--ulimit stack=67108864`)")
    stack = rlimit_of(limits, "stack")
    if stack is None:
        return CONTAINER_STACK(title, "warn", limits.rlimits.text(), expected,
                               FIX_UNREADABLE)
    found = (f"soft {limit_text(-1 if stack.soft is None else stack.soft)}, "
             f"hard {limit_text(-1 if stack.hard is None else stack.hard)}")
    if stack.soft is None or stack.soft >= NVIDIA_STACK:
        return CONTAINER_STACK(title, "ok", found, expected)
    if not demand.gpus:
        return CONTAINER_STACK(title, "ok", found + " (no GPU used)", expected)
    return CONTAINER_STACK(
        title, "warn", found, expected,
        "compose: `ulimits: {stack: 67108864}`; docker run: --ulimit stack=67108864 "
        "(bytes); outside a container: `ulimit -s 65536` (KiB) before mgpu")
