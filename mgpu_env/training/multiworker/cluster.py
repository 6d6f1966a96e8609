"""The cluster TF_CONFIG or WORKER_HOSTS + WORKER_INDEX describe, and a non-chief
worker's scratch folder."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import Settings
from mgpu_env.training.strategy import WorkerRole

# ------------------------------------------------------------------------------ cluster


@dataclass(frozen=True)
class Cluster:
    """A multi-worker cluster as this process sees it."""

    jobs: dict[str, tuple[str, ...]]  # "chief"/"worker" -> host:port addresses
    task_type: str
    task_index: int
    source: str  # "TF_CONFIG" or "WORKER_HOSTS"

    @property
    def num_workers(self) -> int:
        return sum(len(addresses) for addresses in self.jobs.values())

    @property
    def address(self) -> str:
        return self.jobs[self.task_type][self.task_index]

    @property
    def role(self) -> WorkerRole:
        return WorkerRole(
            self.task_type, self.task_index, self.num_workers, _has_chief="chief" in self.jobs
        )

    @property
    def name(self) -> str:
        """This task as the user reads it: "worker 1 (10.0.0.2:2222)"."""
        return f"{self.task_type} {self.task_index} ({self.address})"

    def tf_config(self) -> str:
        return json.dumps(
            {
                "cluster": {job: list(addresses) for job, addresses in self.jobs.items()},
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )


def resolve_cluster(settings: Settings) -> Cluster | None:
    """The cluster TF_CONFIG or WORKER_HOSTS + WORKER_INDEX describe; None for one process.

    Each setting was validated alone when resolved; this checks them together. Raises
    ConfigError (exit 2).
    """
    hosts, index, tf_config = settings.worker_hosts, settings.worker_index, settings.tf_config
    if tf_config and (hosts or index is not None):
        raise ConfigError(
            "Both TF_CONFIG and WORKER_HOSTS/WORKER_INDEX are set; they describe the same "
            "cluster twice.\n  Fix: unset WORKER_HOSTS and WORKER_INDEX (a launcher set "
            "TF_CONFIG), or unset TF_CONFIG."
        )
    if tf_config:
        config = json.loads(tf_config)
        jobs = {job: tuple(config["cluster"][job]) for job in ("chief", "worker")
                if job in config["cluster"]}
        return Cluster(jobs, config["task"]["type"], int(config["task"]["index"]), "TF_CONFIG")
    if not hosts and index is None:
        return None
    if not hosts:
        raise ConfigError(
            f"WORKER_INDEX={index} is set but WORKER_HOSTS is empty.\n"
            "  Fix: set WORKER_HOSTS to every worker's host:port (the same list on each), "
            "or unset WORKER_INDEX."
        )
    if index is None:
        raise ConfigError(
            f"WORKER_HOSTS lists {len(hosts)} worker(s) but WORKER_INDEX is not set.\n"
            f"  Fix: set WORKER_INDEX to this worker's position in the list, 0..{len(hosts) - 1} "
            "(0 is the chief)."
        )
    if index >= len(hosts):
        raise ConfigError(
            f"WORKER_INDEX={index} but WORKER_HOSTS lists {len(hosts)} worker(s): "
            f"{','.join(hosts)}.\n  Valid: 0..{len(hosts) - 1}. Fix: set WORKER_INDEX to this "
            "worker's position in WORKER_HOSTS."
        )
    return Cluster({"worker": hosts}, "worker", index, "WORKER_HOSTS")


def scratch_dir(role: WorkerRole) -> Path:
    """A private folder for a non-chief worker's share of the checkpoints, deleted after.

    TensorFlow's checkpoint save is collective, so every worker saves; only the chief's
    copy, in OUTPUT_DIR, is kept (the multi-worker tutorial's `write_filepath` pattern).
    """
    return Path(tempfile.mkdtemp(prefix=f"mgpu-{role.task_type}{role.task_id}-ckpt-"))


def remove_scratch_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


