"""The cluster this process belongs to: what the package offers, named from its modules.

`decide` decides it (`decide_cluster`), one reader per engine (`explicit`, `slurm`,
`kubernetes`) returns the one shape `model` defines, `peers` asks whether the others can be
reached, `local` starts several workers on this machine.
"""

<<<<<<< HEAD
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import Settings
from mgpu_env.runtime.cluster.explicit import from_tf_config, from_worker_hosts
from mgpu_env.runtime.cluster.kubernetes import (
    from_indexed_job,
    in_indexed_job,
    unused_index_note,
)
=======
from mgpu_env.runtime.cluster.decide import ClusterDecision, decide_cluster
>>>>>>> shapes
from mgpu_env.runtime.cluster.model import ENGINE_NAMES, ENGINES, Cluster, NodeShare

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Cluster",
    "ClusterDecision",
    "NodeShare",
    "decide_cluster",
]
<<<<<<< HEAD


@dataclass(frozen=True)
class ClusterDecision:
    cluster: Cluster | None
    notes: tuple[str, ...] = ()


def decide_cluster(settings: Settings, environ: Mapping[str, str]) -> ClusterDecision:
    """The cluster and what was said about the engines not used. Raises ConfigError (exit 2)
    for settings or engine variables that contradict each other."""
    if settings.tf_config and (settings.worker_hosts or settings.worker_index is not None):
        raise ConfigError(
            "Both TF_CONFIG and WORKER_HOSTS/WORKER_INDEX are set; they describe the same "
            "cluster twice.\n  Fix: unset WORKER_HOSTS and WORKER_INDEX (a launcher set "
            "TF_CONFIG), or unset TF_CONFIG."
        )
    explicit: Cluster | None = None
    if settings.tf_config:
        explicit = from_tf_config(settings.tf_config)
    else:
        explicit = from_worker_hosts(settings.worker_hosts, settings.worker_index)
    if explicit is not None:
        ignored = [name for name, present in (
            ("Slurm's step", in_slurm_step(environ)),
            ("the Kubernetes Indexed Job's", in_indexed_job(environ)),
        ) if present]
        notes = tuple(
            f"{explicit.engine_name} describes the cluster; {what} variables are not used"
            for what in ignored
        )
        return ClusterDecision(explicit, notes)
    slurm = from_slurm(environ, settings.worker_port)
    if slurm is not None:
        return ClusterDecision(slurm)
    kubernetes = from_indexed_job(environ, settings.worker_port)
    if kubernetes is not None:
        return ClusterDecision(kubernetes)
    notes = tuple(n for n in (batch_script_note(environ), unused_index_note(environ)) if n)
    return ClusterDecision(None, notes)
=======
>>>>>>> shapes
