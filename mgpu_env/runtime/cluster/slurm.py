"""The cluster Slurm describes to each task of an `srun` step.

Read from the step's own variables (never `scontrol`): `SLURM_PROCID` (this task's rank:
the worker index, 0 the chief), `SLURM_STEP_NUM_TASKS`, `SLURM_STEP_NODELIST` (a hostlist
such as `gpu[009-011],dgx7`, expanded by python-hostlist as Slurm does, zero padding kept),
`SLURM_STEP_TASKS_PER_NODE` (`2(x3),1`) and `SLURM_LOCALID` (this task's place on its
node). Ranks are laid out by block, Slurm's default: the first node's tasks, then the
next's. Each task listens on WORKER_PORT + its local id, so the tasks of one node never
collide on a port.

A batch script run without `srun` has `SLURM_PROCID=0` and the allocation's
`SLURM_NTASKS` but no `SLURM_STEP_*` variables: that is one process, with a note.

Compared with TensorFlow's `SlurmClusterResolver`: the same variables and block layout,
but names keep their zero padding (tensorflow#49956) and the GPUs of a task are decided
by the runtime from the node's share (`NodeShare`), so a device list Slurm already
narrowed is kept rather than counted as zero GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping

import hostlist

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.text import is_digits, plain, shown, whole_number
from mgpu_env.runtime.cluster.model import Cluster, NodeShare

STEP_VARIABLES = (
    "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID",
)
MAX_PORT = 65535


def in_slurm_job(environ: Mapping[str, str]) -> bool:
    return "SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    return "SLURM_STEP_NUM_TASKS" in environ


def batch_script_note(environ: Mapping[str, str]) -> str | None:
    """The note for a Slurm job's batch script run without srun, if it has several tasks."""
    if not in_slurm_job(environ) or in_slurm_step(environ):
        return None
    tasks = environ.get("SLURM_NTASKS", "1")
    count = whole_number(tasks) if is_digits(tasks) else None
    if count is None or count <= 1:
        return None
    return (
        f"Slurm job {environ.get('SLURM_JOB_ID', '?')} has {tasks} tasks, but this runs in its "
        "batch script, outside any srun step: one process, not a cluster. Start it with "
        "`srun mgpu ...` to use every task"
    )


def _error(what: str, fix: str, environ: Mapping[str, str]) -> ConfigError:
    seen = "  ".join(f"{k}={plain(environ.get(k, '(unset)'))}" for k in STEP_VARIABLES)
    return ConfigError(
        f"Slurm's step variables do not describe a cluster: {what}.\n  Seen: {seen}\n"
        f"  Fix: {fix}"
    )


def _int(environ: Mapping[str, str], name: str) -> int:
    text = environ.get(name, "")
    value = whole_number(text) if is_digits(text.strip()) else None
    if value is None:  # digits 0-9 only: isdigit also passes '²', which int() refuses
        raise _error(f"{name}={shown(text)} is not a whole number",
                     "start mgpu with srun inside the job, not with these variables set "
                     "by hand", environ)
    return value


def from_slurm(environ: Mapping[str, str], port_base: int) -> Cluster | None:
    """The step's cluster; None outside a step or for a step of one task."""
    if not in_slurm_step(environ):
        return None
    tasks = _int(environ, "SLURM_STEP_NUM_TASKS")
    if tasks <= 1:
        return None
    rank = _int(environ, "SLURM_PROCID")
    local_id = _int(environ, "SLURM_LOCALID")
    try:
        nodes = hostlist.expand_hostlist(environ.get("SLURM_STEP_NODELIST", ""))
        per_node = hostlist.parse_slurm_tasks_per_node(
            environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    except (hostlist.BadHostlist, ValueError) as err:
        raise _error(f"a hostlist does not parse ({err})",
                     "start mgpu with srun, which writes these lists itself", environ) from None
    if not nodes or len(nodes) != len(per_node):
        raise _error(
            f"{len(nodes)} node(s) in SLURM_STEP_NODELIST but {len(per_node)} count(s) in "
            "SLURM_STEP_TASKS_PER_NODE", "start mgpu with srun", environ)
    if sum(per_node) != tasks:
        raise _error(
            f"the tasks per node add up to {sum(per_node)}, not SLURM_STEP_NUM_TASKS={tasks}",
            "start mgpu with srun", environ)
    if rank >= tasks:
        raise _error(f"SLURM_PROCID={rank} is not below SLURM_STEP_NUM_TASKS={tasks}",
                     "start mgpu with srun", environ)
    most = max(per_node)
    if port_base + most - 1 > MAX_PORT:
        raise ConfigError(
            f"WORKER_PORT={port_base} with {most} Slurm tasks on one node needs ports up to "
            f"{port_base + most - 1}, past {MAX_PORT}.\n"
            f"  Valid: WORKER_PORT from 1024 to {MAX_PORT - most + 1} here. Fix: set a lower "
            "WORKER_PORT (the default is 2222)."
        )
    addresses = [f"{node}:{port_base + local}"
                 for node, count in zip(nodes, per_node, strict=True) for local in range(count)]
    node_index, expected_local = _block_place(per_node, rank)
    if local_id != expected_local or (
        "SLURM_NODEID" in environ and environ["SLURM_NODEID"] != str(node_index)
    ):
        raise _error(
            f"task {rank} is local task {local_id} of node {environ.get('SLURM_NODEID', '?')}, "
            f"not local task {expected_local} of node {node_index} as a block layout puts it",
            "use Slurm's default task layout (srun --distribution=block); mgpu numbers the "
            "workers node by node", environ)
    return Cluster(
        {"worker": tuple(addresses)}, "worker", rank, "slurm",
        node=NodeShare(local_id, per_node[node_index]),
    )


def _block_place(per_node: list[int], rank: int) -> tuple[int, int]:
    """(node index, local id) of a rank when ranks fill the nodes one after another."""
    first = 0
    for node, count in enumerate(per_node):
        if rank < first + count:
            return node, rank - first
        first += count
    raise AssertionError("rank checked against the task count before")
