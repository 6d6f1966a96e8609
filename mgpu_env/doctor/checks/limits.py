"""Every limit that stops TensorFlow, reported together.

Every limit that stops TensorFlow, reported as one line where each holds what this machine
makes TensorFlow ask for (a healthy machine stays quiet), each on its own line otherwise:
threads, memory, address space and open files (`processlimits`), /dev/shm, memlock and the
stack (`gpulimits`)."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import Check, CheckId, check
from mgpu_env.doctor.checks.gpulimits import check_memlock, check_shm, check_stack
from mgpu_env.doctor.checks.processlimits import (
    check_address_space,
    check_memory,
    check_open_files,
    check_threads,
    demand_of,
)
from mgpu_env.doctor.demand import size_text
from mgpu_env.doctor.facts import Facts

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
LIMITS = CheckId("limits")

JUDGES = (check_threads, check_memory, check_address_space, check_open_files, check_shm,
          check_memlock, check_stack)


@check(255, LIMITS)
def check_limits(facts: Facts) -> list[Check]:
    """The limits, one line when all hold; otherwise each on its own line."""
    checks = [judge(facts) for judge in JUDGES]
    limits = facts.host.limits
    if limits is None or any(c.status != "ok" for c in checks):
        return checks
    demand = demand_of(facts, limits)
    shm = limits.shm.value[0] if limits.shm.value else 0
    return [LIMITS("Limits", "ok",
                   f"room for TensorFlow's {demand.threads} threads, "
                   f"{size_text(demand.memory)}, {demand.open_files} files; /dev/shm "
                   f"{size_text(shm)}",
                   "room for what TensorFlow asks here: threads, memory, address space, open "
                   "files, /dev/shm, memlock, stack (each on its own line where one does not "
                   "hold; --json's facts.host.limits has every value read)")]
