"""The cluster: which engine described it, and whether every peer can be reached."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import Check, CheckId, Status, check
from mgpu_env.doctor.facts import Facts
from mgpu_env.runtime.cluster.peers import explain

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
CLUSTER = CheckId("cluster")

TITLE = "Cluster"


@check(320, CLUSTER)
def check_cluster(facts: Facts) -> list[Check]:
    """Nothing for one process; else the cluster line, and one verdict on the peers."""
    found = facts.cluster
    if found.error is not None:
        what, _, fix = found.error.partition("\n")
        return [CLUSTER(TITLE, "error", what, "one cluster description",
                        fix.strip().removeprefix("Fix: "), bad_setting=True)]
    if found.cluster is None:
        return []
    engine = found.cluster["engine"]
    described = (f"{found.engine_name}: worker {found.cluster['index']} of "
                 f"{len(found.cluster['workers'])} at {found.address}")
    unreachable = [p for p in found.peers if not p.reachable]
    if not unreachable:
        return [CLUSTER(TITLE, "ok", f"{described}; every peer answers",
                        "every peer resolves and answers on its port")]
    # A refused port is a peer not started yet (normal before the job starts); a name that
    # does not resolve or silence is something that training would wait on in vain.
    status: Status = "warn" if all(p.state == "refused" for p in unreachable) else "error"
    names = ", ".join(p.address for p in unreachable)
    return [CLUSTER(
        TITLE, status, f"{described}; not reachable: {names}",
        "every peer resolves and answers on its port",
        " | ".join(explain(unreachable, engine, "WORKER_PORT" if engine in (
            "slurm", "kubernetes") else "the port in the cluster settings")),
    )]
