"""The one shape every engine's cluster takes (TensorFlow's cluster resolvers' idea)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mgpu_env.runtime.strategy import WorkerRole

# What `cluster.engine` can be, in the order the engines are tried.
ENGINES = ("tf_config", "worker_hosts", "slurm", "kubernetes")
ENGINE_NAMES = {
    "tf_config": "TF_CONFIG",
    "worker_hosts": "WORKER_HOSTS",
    "slurm": "Slurm",
    "kubernetes": "Kubernetes Indexed Job",
}


@dataclass(frozen=True)
class NodeShare:
    """This process's place on its machine, when an engine starts several there (Slurm):
    which of the node's tasks it is, out of how many. Its GPUs are decided from this."""

    local_id: int
    tasks_on_node: int


def line_tag(index: int) -> str:
    """What starts every line worker `index` prints ("[worker 1] "): a batch system writes
    every worker's output into files read side by side, or into one. The CLI's lines, the
    library's and a `--workers` launcher's relay of them all use it."""
    return f"[worker {index}] "


@dataclass(frozen=True)
class Cluster:
    """A multi-worker cluster as this process sees it, whichever engine described it."""

    jobs: dict[str, tuple[str, ...]]  # "chief"/"worker" -> host:port addresses
    task_type: str
    task_index: int
    engine: str  # one of ENGINES
    node: NodeShare | None = None

    @property
    def num_workers(self) -> int:
        return sum(len(addresses) for addresses in self.jobs.values())

    @property
    def address(self) -> str:
        return self.jobs[self.task_type][self.task_index]

    @property
    def workers(self) -> tuple[str, ...]:
        """Every task's address, the chief first: the order `index` counts in."""
        return self.jobs.get("chief", ()) + self.jobs.get("worker", ())

    @property
    def index(self) -> int:
        """This task's position in `workers`."""
        return self.workers.index(self.address)

    @property
    def line_tag(self) -> str:
        """What starts every line this worker prints: "[worker 1] "."""
        return line_tag(self.index)

    @property
    def role(self) -> WorkerRole:
        return WorkerRole(
            self.task_type, self.task_index, self.num_workers, _has_chief="chief" in self.jobs
        )

    @property
    def name(self) -> str:
        """This task as the user reads it: "worker 1 (10.0.0.2:2222)"."""
        return f"{self.task_type} {self.task_index} ({self.address})"

    @property
    def engine_name(self) -> str:
        return ENGINE_NAMES[self.engine]

    def tf_config(self) -> str:
        """The TF_CONFIG TensorFlow reads, whatever engine described the cluster."""
        return json.dumps(
            {
                "cluster": {job: list(addresses) for job, addresses in self.jobs.items()},
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )

    def describe(self) -> dict[str, Any]:
        """The cluster in `--json` outputs (`"cluster"`; null for one process)."""
        return {
            "engine": self.engine,
            "workers": list(self.workers),
            "index": self.index,
            "chief": self.role.is_chief,
        }
