"""The training gate: training starts only on a machine the pre-flight checks pass.

The training gate: `preflight` runs the doctor's pre-flight checks (`@check(...,
preflight=True)`) on a runtime, `require_ready` stops `mgpu train` and `mgpu run` with their
findings. A GPU machine whose GPUs cannot be used stops here (GPUS=none is how to mean the
CPU), never silently trains on the CPU."""

from __future__ import annotations

import os

import mgpu_env.doctor.facts as probes
from mgpu_env.config.errors import ConfigError, RunFailed
from mgpu_env.doctor.checks import (
    PREFLIGHT_CHECKS,
    Check,
    CheckFunction,
    check_nvml,
    check_request,
    run_checks,
)
from mgpu_env.doctor.checks.common import CheckId
from mgpu_env.doctor.facts import ClusterFacts, Facts, HostFacts
from mgpu_env.hardware import cudalibs, hostgpus, nvml
from mgpu_env.hardware.cudalibs import CudaStack
from mgpu_env.runtime import Runtime
from mgpu_env.runtime.cluster import peers
from mgpu_env.tfprobes import tfprobe
from mgpu_env.tfprobes.tfprobe import TfFacts

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
CLUSTER_PEERS = CheckId("cluster.peers")


def preflight(
    runtime: Runtime,
    *,
    tensorflow: TfFacts | None = None,
    cuda: CudaStack | None = None,
    strict: bool = False,
    peers_wait_s: float | None = None,
) -> list[Check]:
    """The checks that decide whether training can start; returns only the failing ones.

    Judges the runtime's own NVML snapshot and GPU selection (nothing is selected again),
    after `runtime.apply()` and before the strategy is built. GPUS=none or no GPU: only
    NVML's answer is judged (milliseconds). With GPUs it imports TensorFlow in this process
    (training does anyway) unless `tensorflow` facts are passed, and loads the CUDA libraries
    here (`cudalibs`: where TensorFlow will look, NCCL included) unless `cuda` is passed.
    `strict`: warnings fail too. In a cluster every peer's host must resolve within
    `peers_wait_s` seconds (None: not checked).
    """
    failing = [] if peers_wait_s is None else _unresolved_peers(runtime, peers_wait_s)
    if runtime.settings.gpus.kind == "none":
        return failing
    checks: tuple[CheckFunction, ...]
    if not runtime.selection.gpus:
        checks = (check_nvml, check_request)
    else:
        checks = PREFLIGHT_CHECKS
        if tensorflow is None:
            tensorflow = tfprobe.collect_in_process()
        if cuda is None:
            cuda = cudalibs.collect_in_process(os.environ)
    facts = Facts(
        request=runtime.settings.gpus,
        nvml=runtime.nvml,
        selection=runtime.selection,
        selection_error=None,
        # The variables as the user set them, not as the runtime just wrote them.
        environ=probes.reported_environ(
            {k: v for k, v in os.environ.items() if k not in runtime.environment}
        ),
        # The host's GPUs as /proc and /sys show them: the CPU compose file on a GPU host.
        # and what tells NVML's failures apart: a GPU machine never trains on the CPU by
        # mistake (GPUS=none is how to mean the CPU).
        host=HostFacts(host_gpus=nvml.probe(hostgpus.host_nvidia_gpus),
                       in_container=probes.probe_in_container(),
                       device_files=probes.probe_device_files(),
                       nvidia=probes.probe_nvidia_host()),
        versions={},
        tensorflow=tensorflow,
        cuda=cuda,
        xla=runtime.settings.xla,
        cross_device_ops=runtime.settings.cross_device_ops,
        nccl=probes.probe_nccl(os.environ),
        cluster=(ClusterFacts(runtime.cluster.describe()) if runtime.cluster is not None
                 else ClusterFacts()),
    )
    results = run_checks(facts, checks)
    return failing + [
        c for c in results if c.status == "error" or (strict and c.status == "warn")
    ]


def require_ready(runtime: Runtime, *, wait_for_peers: bool = True) -> None:
    """The doctor's checks that decide whether training can start (driver, CUDA, cuDNN,
    visible devices); stops the run with their findings and fixes when one fails.

    A bad setting (a GPU the machine does not have) is a ConfigError (exit 2), anything
    else a RunFailed (exit 1). With GPUS=none or no GPU it costs milliseconds. In a cluster
    it waits (up to WORKER_TIMEOUT) for every peer's host to resolve, unless
    `wait_for_peers` is false (a dry run, which only notes the missing).
    """
    failing = preflight(
        runtime, peers_wait_s=runtime.settings.worker_timeout if wait_for_peers else None)
    if not failing:
        return
    lines = []
    for check in failing:
        expected = f" (expected {check.expected})" if check.expected else ""
        lines.append(f"pre-flight check failed: {check.title}: {check.found}{expected}")
        if check.fix:
            lines.append(f"  Fix: {check.fix}")
    lines.append("  `mgpu doctor` shows the whole report.")
    error = ConfigError if any(check.bad_setting for check in failing) else RunFailed
    raise error("\n".join(lines))


def _unresolved_peers(runtime: Runtime, wait_s: float) -> list[Check]:
    """In a cluster, every peer's host must resolve before TensorFlow waits on it: the
    pre-flight waits for that (peers start at different times) up to WORKER_TIMEOUT, then
    names the ones that never did. A port with nothing on it yet is normal here (the peer
    is starting too): TensorFlow waits for that itself."""
    cluster = runtime.cluster
    if cluster is None:
        return []
    missing = peers.wait_until_resolved(cluster, wait_s)
    if not missing:
        return []
    statuses = [peers.PeerStatus(a, "unresolved", f"{a.rpartition(':')[0]} does not resolve")
                for a in cluster.workers if a.rpartition(":")[0] in missing]
    return [CLUSTER_PEERS(
        "Cluster peers", "error",
        f"{cluster.engine_name}: after {wait_s:g} s these peers still do not resolve: "
        f"{', '.join(s.address for s in statuses)}",
        "every peer's host name resolves",
        " | ".join(peers.explain(statuses, cluster.engine, "WORKER_PORT")),
    )]
