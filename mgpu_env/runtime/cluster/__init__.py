"""The cluster this process belongs to: what the package offers, named from its modules.

`decide` decides it (`decide_cluster`), one reader per engine (`explicit`, `slurm`,
`kubernetes`) returns the one shape `model` defines, `peers` asks whether the others can be
reached, `local` starts several workers on this machine.
"""

from mgpu_env.runtime.cluster.decide import ClusterDecision, decide_cluster
from mgpu_env.runtime.cluster.model import ENGINE_NAMES, ENGINES, Cluster, NodeShare

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Cluster",
    "ClusterDecision",
    "NodeShare",
    "decide_cluster",
]
