"""The clusters the user (or a launcher) wrote down.

Clusters the user (or a launcher such as Kubeflow's TFJob operator) wrote down: TF_CONFIG, or
WORKER_HOSTS + WORKER_INDEX. Each setting was checked alone when it was resolved
(`config.parsers`); these check them together."""

from __future__ import annotations

import json

from mgpu_env.config.errors import ConfigError
from mgpu_env.runtime.cluster.model import Cluster

# The TFJob operator names its first replica type "master" in older jobs (lower case, as
# every type it writes); it plays the chief's part, and MultiWorkerMirroredStrategy takes
# only "chief" and "worker", so it is given to TensorFlow as "chief".
CHIEF_ALIASES = {"master": "chief"}


def from_tf_config(text: str) -> Cluster:
    config = json.loads(text)
    jobs: dict[str, tuple[str, ...]] = {}
    for job, addresses in config["cluster"].items():
        jobs[CHIEF_ALIASES.get(job, job)] = tuple(addresses)
    ordered: dict[str, tuple[str, ...]] = {
        job: jobs[job] for job in ("chief", "worker") if job in jobs
    }
    task_type = CHIEF_ALIASES.get(config["task"]["type"], config["task"]["type"])
    return Cluster(ordered, task_type, int(config["task"]["index"]), "tf_config")


def from_worker_hosts(hosts: tuple[str, ...], index: int | None) -> Cluster | None:
    """None when neither is set (one process)."""
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
    return Cluster({"worker": hosts}, "worker", index, "worker_hosts")
