"""Gathering the doctor's facts once and judging them.

`gather` runs every probe (NVML, the host, CUDA's driver API, TensorFlow and the CUDA
libraries in children) and reads training's decisions from the runtime's record (decided once
per run, `runtime.record.decide`); `diagnose` judges them all and, with `smoke`, runs the
smoke job with the same runtime."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mgpu_env.doctor.facts as probes
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import ResolvedSettings
from mgpu_env.doctor.checks import ALL_CHECKS, run_checks
from mgpu_env.doctor.facts import Facts, HostFacts, KerasFacts
from mgpu_env.doctor.verdict import Diagnosis
from mgpu_env.hardware import cudadriver, cudalibs, hostroot, nvml
from mgpu_env.hardware.cudadriver import DriverApi
from mgpu_env.hardware.cudalibs import CudaStack
from mgpu_env.hardware.devices import GpuSelection
from mgpu_env.hardware.hostfacts import P2pHost
from mgpu_env.hardware.nvml import Probed
from mgpu_env.runtime import Decisions, Runtime, decide, probe_machine
from mgpu_env.tfprobes import tfprobe
from mgpu_env.tfprobes.tfprobe import TfFacts

if TYPE_CHECKING:
    from mgpu_env.hardware.dockerhost import DockerHost


def _decide(
    resolved: ResolvedSettings, environ: Mapping[str, str], snapshot: nvml.NvmlSnapshot
) -> tuple[Decisions, Runtime | None]:
    """What training decides here, part by part, and its runtime; None when the settings
    cannot make one (the checks then say why, from the record: GPUS against the machine,
    the precision request, ...)."""
    machine = probe_machine(resolved.settings, environ, snapshot=snapshot)
    decisions = decide(resolved, machine, command="train")
    return decisions, None if decisions.failures else decisions.runtime()


def _keras_facts(decisions: Decisions) -> KerasFacts:
    """The Keras training decided, and the one a script under `mgpu run` would get."""
    if decisions.keras is None:
        return KerasFacts(error=decisions.error("keras"))
    try:
        return KerasFacts(decisions.keras_for("run"), decisions.keras)
    except ConfigError as err:
        return KerasFacts(error=str(err))


def _environment_for_tensorflow(
    runtime: Runtime | None, environ: Mapping[str, str]
) -> dict[str, str]:
    # TensorFlow must see exactly what training would give it.
    env = dict(environ)
    if runtime is not None:
        runtime.apply(env)
    return env


@dataclass(frozen=True)
class ChildProbes:
    """The probes `gather` runs in children with the runtime's environment, each None for
    the real one (looked up when called, so a test can patch the module's `collect`) or a
    canned answer's function."""

    tensorflow: Callable[[Mapping[str, str]], TfFacts] | None = None
    cuda: Callable[[Mapping[str, str]], CudaStack] | None = None
    driver: Callable[[Mapping[str, str]], Probed[DriverApi]] | None = None


def gather_with_runtime(
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    children: ChildProbes = ChildProbes(),
) -> tuple[Decisions, Runtime | None, Facts]:
    """Run every probe once. NVML and the host take milliseconds; TensorFlow seconds.
    Returns what training decides here (decided once, here, part by part), its runtime
    (None when the settings cannot make one) and the facts.

    `environ` is only read (TensorFlow and the CUDA library probe run in children with the
    runtime's environment). `with_tensorflow=False` (--no-tf) skips both.
    """
    environ = os.environ if environ is None else environ
    # Every probe reads under MGPU_HOST_ROOT: a bad value is refused here, once, with its fix
    # (HostRootError, a ConfigError: exit 2), not as a "could not collect" on every line.
    hostroot.host_root()
    # The doctor asks NVML even for GPUS=none: it reports the machine, not only the run.
    snapshot = nvml.snapshot()
    decisions, runtime = _decide(resolved, environ, snapshot)
    selection = decisions.selection
    tf_facts = None
    cuda = None
    child_environ = _environment_for_tensorflow(runtime, environ)
    # Always, NVML or not (milliseconds: a child that loads libcuda.so.1 and calls cuInit,
    # also with --no-tf): when NVML fails, CUDA's answer often names the cause.
    cuda_driver = (children.driver or cudadriver.collect)(child_environ)
    if with_tensorflow:
        tf_facts = (children.tensorflow or tfprobe.collect)(child_environ)
        cuda = (children.cuda or cudalibs.collect)(child_environ)
    settings = resolved.settings
    host = probes.probe_host()
    docker, p2p = _docker_and_p2p(host, selection, resolved, environ)
    return decisions, runtime, Facts(
        request=resolved.settings.gpus,
        nvml=snapshot,
        selection=selection,
        selection_error=decisions.error("gpus"),
        environ=probes.reported_environ(environ),
        host=host,
        versions=probes.probe_versions(),
        tensorflow=tf_facts,
        mixed_precision=settings.mixed_precision,
        precision=decisions.precision,
        precision_error=decisions.error("precision"),
        cuda=cuda,
        xla=settings.xla,
        cross_device_ops=settings.cross_device_ops,
        cluster=probes.probe_cluster(decisions.cluster, decisions.error("cluster")),
        run_folder=probes.probe_run_folder(settings),
        keras=_keras_facts(decisions),
        cuda_driver=cuda_driver,
        docker=docker,
        p2p=p2p,
        nccl=probes.probe_nccl(environ),
        process_names=probes.probe_process_names(snapshot),
    )


def _docker_and_p2p(
    host: HostFacts, selection: GpuSelection | None, resolved: ResolvedSettings,
    environ: Mapping[str, str],
) -> tuple[DockerHost | None, P2pHost | None]:
    """Docker's GPU support where the GPU compose file is selected on a host; the host's
    P2P facts where two GPUs or more are used."""
    docker = None
    if not host.in_container.value and probes.gpu_compose_selected(
            environ, resolved.env_file_values):
        docker = probes.probe_docker()
    p2p = None
    if selection is not None and len(selection.gpus) >= 2:
        p2p = probes.probe_p2p(tuple(g.pci_bus_id.value for g in selection.gpus
                                     if g.pci_bus_id.ok and g.pci_bus_id.value))
    return docker, p2p


def gather(
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    children: ChildProbes = ChildProbes(),
) -> Facts:
    """The facts of `gather_with_runtime`, without the runtime."""
    return gather_with_runtime(
        resolved, environ, with_tensorflow=with_tensorflow, children=children)[2]


def diagnose(
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    smoke: bool = False,
    smoke_timeout_s: float | None = None,
) -> Diagnosis:
    """Gather the facts and judge them all; with `smoke`, also run the smoke job with the
    runtime training would have. Never raises for what it finds."""
    environ = os.environ if environ is None else environ
    decisions, runtime, facts = gather_with_runtime(resolved, environ,
                                                    with_tensorflow=with_tensorflow)
    smoke_result = None
    if smoke:
        import mgpu_env.doctor.smoke as smoke_job

        smoke_result = smoke_job.smoke_test(runtime, environ, smoke_timeout_s, p2p=facts.p2p)
    return Diagnosis(tuple(run_checks(facts, ALL_CHECKS)), facts, smoke_result,
                     decisions.decided())
