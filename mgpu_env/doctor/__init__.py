"""`mgpu doctor` as a library: gather facts, judge them, return the report as data.

    report = diagnose(resolved, os.environ)              # NVML + host + TensorFlow (child)
    report.errors, report.warnings, report.to_dict()     # the CLI renders and picks the code

`preflight` is the cheap subset `mgpu train` runs before it starts: only the checks that
decide whether training can start on the GPUs GPUS asked for. `diagnose(..., smoke=True)`
also runs `mgpu_env.doctor.smoke`: a real all-reduce, an XLA function and a matmul with the
runtime's own decisions, in a child process with a timeout.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import ConfigError, RunFailed
from mgpu_env.config.resolve import ResolvedSettings
from mgpu_env.config.settings import GpuRequest, SettingError, SettingsErrors
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor.checks import (
    ALL_CHECKS,
    Check,
    CheckFunction,
    SkippedGroup,
    Status,
    check_cuda_libraries,
    check_cudnn,
    check_driver_cuda,
    check_driver_version,
    check_nccl,
    check_nvml,
    check_request,
    check_tf_build,
    check_tf_devices,
    gpu_checks,
    group_skipped,
    run_checks,
)
from mgpu_env.doctor.facts import Facts, HostFacts
from mgpu_env.doctor.smoke import SmokeResult
from mgpu_env.hardware import compat, cudadriver, cudalibs, hostgpus, nvml, tfprobe
from mgpu_env.hardware.cudadriver import DriverApi
from mgpu_env.hardware.cudalibs import CudaStack
from mgpu_env.hardware.devices import GpuSelection, select_gpus
from mgpu_env.hardware.nvml import Probed
from mgpu_env.hardware.tfprobe import TfFacts
from mgpu_env.runtime import Runtime, build_runtime
from mgpu_env.runtime.cluster import peers

__all__ = [
    "Check",
    "Facts",
    "Report",
    "SkippedGroup",
    "SmokeResult",
    "Status",
    "diagnose",
    "gather",
    "preflight",
]

# The layout of `mgpu doctor --json`; raised when a key is removed or changes meaning.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Report:
    """The judged checks and the raw facts behind them."""

    checks: tuple[Check, ...]
    facts: Facts
    smoke: SmokeResult | None = None  # None: not asked for (--smoke)

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.status == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def bad_settings(self) -> list[Check]:
        return [c for c in self.checks if c.bad_setting]

    def failing(self, strict: bool = False) -> list[Check]:
        """The errors, and with `strict` the warnings too."""
        return [c for c in self.checks if c.status == "error" or (strict and c.status == "warn")]

    def rows(self, verbose: bool = False) -> list[Check | SkippedGroup]:
        """The checks as the table shows them: with `verbose` each one, else the checks
        skipped for one shared reason (no GPU, --no-tf) folded into one row per reason."""
        return list(self.checks) if verbose else group_skipped(self.checks)

    @property
    def smoke_failed(self) -> bool:
        return self.smoke is not None and not self.smoke.ok

    def verdict(self, strict: bool = False) -> str:
        """One line before the details: `ready: 2 GPUs, TF 2.21.0, CUDA 12.5` or
        `not ready: 1 error`."""
        errors, warnings = len(self.errors), len(self.warnings)
        if errors or (strict and warnings) or self.smoke_failed:
            counted = [_count(errors, "error")] if errors else []
            if strict and warnings:
                counted.append(_count(warnings, "warning") + " (--strict)")
            if self.smoke_failed:
                counted.append("the smoke job failed")
            return "not ready: " + ", ".join(counted)
        gpus = len(self.facts.selected)
        parts = [_count(gpus, "GPU") if gpus else "CPU only"]
        tf = self.facts.tensorflow
        version = tf.version if tf is not None else self.facts.versions.get("TensorFlow")
        if version is not None and version.ok and version.value:
            parts.append(f"TF {version.value}")
        build = tf.build.value if tf is not None and tf.build.ok else None
        if gpus and build is not None and build.is_cuda_build and build.cuda_version:
            parts.append(f"CUDA {compat.minor_of(build.cuda_version)}")
        line = "ready: " + ", ".join(parts)
        return line + (f" ({_count(warnings, 'warning')})" if warnings else "")

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        """One JSON-ready object: the verdict, every check, a summary, and the raw facts."""
        return {
            "schema_version": SCHEMA_VERSION,
            "mgpu_version": __version__,
            "ready": not self.failing(strict) and not self.smoke_failed,
            "verdict": self.verdict(strict),
            "summary": {
                "errors": len(self.errors),
                "warnings": len(self.warnings),
                "bad_settings": len(self.bad_settings),
            },
            "cluster": self.facts.cluster.cluster,
            # The Keras a script under `mgpu run` gets ({"version", "reason", "notes"}).
            "keras": _plain(self.facts.keras.run),
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "facts": _plain(self.facts),
            **({"smoke": _plain(self.smoke)} if self.smoke is not None else {}),
        }


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def unusable_settings(errors: list[str]) -> dict[str, Any]:
    """`mgpu doctor --json`'s object when the settings cannot even be read (a CI parser
    still gets JSON, with the same keys): nothing was checked, and why."""
    return {
        "schema_version": SCHEMA_VERSION,
        "mgpu_version": __version__,
        "ready": False,
        "verdict": f"not ready: {_count(len(errors), 'bad setting')}",
        "summary": {"errors": len(errors), "warnings": 0, "bad_settings": len(errors)},
        "settings_errors": list(errors),
        "cluster": None,
        "keras": None,
        "checks": [],
        "facts": None,
    }


def _plain(value: Any) -> Any:
    if isinstance(value, GpuRequest):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _decide(
    resolved: ResolvedSettings, environ: Mapping[str, str], snapshot: nvml.NvmlSnapshot
) -> Runtime | None:
    """The runtime training would have; None when the settings cannot make one here (the
    checks then say why: GPUS against the machine, the precision request, ...)."""
    try:
        return build_runtime(resolved, environ, command="train", snapshot=snapshot)
    except (SettingsErrors, ConfigError):
        return None


def _environment_for_tensorflow(
    runtime: Runtime | None, environ: Mapping[str, str]
) -> dict[str, str]:
    # TensorFlow must see exactly what training would give it.
    env = dict(environ)
    if runtime is not None:
        runtime.apply(env)
    return env


def gather(
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    collect_tensorflow: Callable[[Mapping[str, str]], TfFacts] | None = None,
    collect_cuda: Callable[[Mapping[str, str]], CudaStack] | None = None,
    collect_driver: Callable[[Mapping[str, str]], Probed[DriverApi]] | None = None,
) -> Facts:
    """Run every probe once. NVML and the host take milliseconds; TensorFlow seconds.

    `environ` is only read (TensorFlow and the CUDA library probe run in children with the
    runtime's environment). `with_tensorflow=False` (--no-tf) skips both.
    """
    environ = os.environ if environ is None else environ
    # The doctor asks NVML even for GPUS=none: it reports the machine, not only the run.
    snapshot = nvml.snapshot()
    runtime = _decide(resolved, environ, snapshot)
    selection, selection_error = _selection_of(runtime, resolved, snapshot, environ)
    tf_facts = None
    cuda = None
    child_environ = _environment_for_tensorflow(runtime, environ)
    # Always, NVML or not (milliseconds: a child that loads libcuda.so.1 and calls cuInit,
    # also with --no-tf): when NVML fails, CUDA's answer often names the cause.
    cuda_driver = (collect_driver or cudadriver.collect)(child_environ)
    if with_tensorflow:
        tf_facts = (collect_tensorflow or tfprobe.collect)(child_environ)
        cuda = (collect_cuda or cudalibs.collect)(child_environ)
    settings = resolved.settings
    host = probes.probe_host()
    docker = None
    if not host.in_container.value and probes.gpu_compose_selected(
            environ, resolved.env_file_values):
        docker = probes.probe_docker()
    p2p = None
    if selection is not None and len(selection.gpus) >= 2:
        p2p = probes.probe_p2p(tuple(g.pci_bus_id.value for g in selection.gpus
                                     if g.pci_bus_id.ok and g.pci_bus_id.value))
    return Facts(
        request=resolved.settings.gpus,
        nvml=snapshot,
        selection=selection,
        selection_error=selection_error,
        environ=probes.reported_environ(environ),
        host=host,
        versions=probes.probe_versions(),
        tensorflow=tf_facts,
        mixed_precision=settings.mixed_precision,
        cuda=cuda,
        xla=settings.xla,
        cross_device_ops=settings.cross_device_ops,
        cluster=(cluster := probes.probe_cluster(settings, environ)),
        run_folder=probes.probe_run_folder(settings),
        keras=probes.probe_keras(settings, environ, resolved.env_file_values,
                                 multi_worker=cluster.cluster is not None),
        cuda_driver=cuda_driver,
        docker=docker,
        p2p=p2p,
        nccl=probes.probe_nccl(environ),
    )


def _selection_of(
    runtime: Runtime | None, resolved: ResolvedSettings, snapshot: nvml.NvmlSnapshot,
    environ: Mapping[str, str],
) -> tuple[GpuSelection | None, str | None]:
    """The runtime's GPU selection; when the settings made no runtime, the selection alone
    (a precision or all-reduce that cannot work is judged by its own check), or why GPUS
    does not fit the machine."""
    if runtime is not None:
        return runtime.selection, None
    try:
        return select_gpus(resolved.settings.gpus, snapshot.listing, environ), None
    except SettingError as err:
        return None, str(err)


def diagnose(
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    smoke: bool = False,
    smoke_timeout_s: float | None = None,
) -> Report:
    """Gather the facts and judge them all; with `smoke`, also run the smoke job with the
    runtime training would have. Never raises for what it finds."""
    environ = os.environ if environ is None else environ
    facts = gather(resolved, environ, with_tensorflow=with_tensorflow)
    smoke_result = None
    if smoke:
        from mgpu_env.doctor import smoke as smoke_job

        runtime = _decide(resolved, environ, facts.nvml)
        smoke_result = smoke_job.run(runtime, environ, smoke_timeout_s, p2p=facts.p2p)
    return Report(tuple(run_checks(facts, ALL_CHECKS)), facts, smoke_result)


PREFLIGHT_CHECKS = (
    check_nvml,
    check_driver_version,
    check_driver_cuda,
    check_request,
    check_tf_build,
    check_cuda_libraries,
    check_cudnn,
    check_nccl,
    gpu_checks,
    check_tf_devices,
)


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
    missing = peers.wait_until_resolved(cluster.workers, cluster.address, wait_s)
    if not missing:
        return []
    statuses = [peers.PeerStatus(a, "unresolved", f"{a.rpartition(':')[0]} does not resolve")
                for a in cluster.workers if a.rpartition(":")[0] in missing]
    return [Check(
        "cluster.peers", "Cluster peers", "error",
        f"{cluster.engine_name}: after {wait_s:g} s these peers still do not resolve: "
        f"{', '.join(s.address for s in statuses)}",
        "every peer's host name resolves",
        " | ".join(peers.explain(statuses, cluster.engine, "WORKER_PORT")),
    )]
