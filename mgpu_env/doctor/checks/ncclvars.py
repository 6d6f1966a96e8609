"""NCCL's variables, checked against this machine.

NCCL's variables against this machine: interfaces and HCAs that exist, values NCCL documents,
names NCCL knows (`mgpu_env.hardware.ncclenv` holds the model)."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import Check, CheckId, check, fewer_than_two_gpus
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import ncclenv

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
NCCL_VARIABLES = CheckId("nccl.variables")

TITLE = "NCCL variables"
EXPECTED = "every NCCL_* variable names this machine's devices and a value NCCL knows"


@check(120, NCCL_VARIABLES, preflight=True)
def check_nccl_variables(facts: Facts) -> Check | list[Check]:
    nccl = facts.nccl
    if nccl is None:
        return NCCL_VARIABLES(TITLE, "skip", "not probed", EXPECTED)
    if not nccl.environ:
        if len(facts.selected) < 2:  # nothing to say where NCCL does not run
            return NCCL_VARIABLES(TITLE, "skip", "none set", EXPECTED,
                                  skipped_for=fewer_than_two_gpus(facts))
        return NCCL_VARIABLES(TITLE, "ok", "none set (NCCL's defaults)", EXPECTED)
    findings = ncclenv.judge(nccl.environ, nccl.interfaces, nccl.hcas)
    if not findings:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(nccl.environ.items()))
        return NCCL_VARIABLES(TITLE, "ok", shown, EXPECTED)
    # NCCL runs where 2+ GPUs all-reduce (or workers talk): there a wrong value stops the
    # first all-reduce; elsewhere it is only a warning about a setting nothing reads.
    used = len(facts.selected) >= 2 or facts.cluster.cluster is not None
    return [NCCL_VARIABLES.child(f.name)(
        TITLE,
"error" if f.status == "error" and used else "warn",
f"{f.name}={f.value!r}: {f.problem}"
+ ("" if used or f.status != "error" else " (NCCL is not used by this run)"),
EXPECTED, f.fix) for f in findings]
