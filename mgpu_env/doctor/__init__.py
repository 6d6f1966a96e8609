"""`mgpu doctor` as a library: gather facts, judge them, return the report as data.

    report = diagnose(settings.gpus, os.environ)        # NVML + host + TensorFlow (child)
    report.errors, report.warnings, report.to_dict()     # the CLI renders and picks the code

`preflight` is the cheap subset `mgpu train` runs before it starts: only the checks that
decide whether training can start on the GPUs GPUS asked for. `diagnose(..., smoke=...)`
also runs `mgpu_env.doctor.smoke`: a real all-reduce, an XLA function and a matmul in a
child process with a timeout.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.settings import GpuRequest, SettingError
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor.checks import (
    ALL_CHECKS,
    Check,
    CheckFunction,
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
    run_checks,
)
from mgpu_env.doctor.facts import Facts, HostFacts
from mgpu_env.doctor.smoke import SmokeRequest, SmokeResult
from mgpu_env.hardware import cudalibs, nvml, tfprobe
from mgpu_env.hardware.cudalibs import CudaStack
from mgpu_env.hardware.devices import GpuSelection, apply_gpu_selection, select_gpus
from mgpu_env.hardware.tfprobe import TfFacts

__all__ = [
    "Check",
    "Facts",
    "Report",
    "SmokeRequest",
    "SmokeResult",
    "Status",
    "diagnose",
    "gather",
    "preflight",
]


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

    def to_dict(self) -> dict[str, Any]:
        """One JSON-ready object: every check, a summary, and the raw facts."""
        return {
            "summary": {
                "errors": len(self.errors),
                "warnings": len(self.warnings),
                "bad_settings": len(self.bad_settings),
            },
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "facts": _plain(self.facts),
            **({"smoke": _plain(self.smoke)} if self.smoke is not None else {}),
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


def _select(
    request: GpuRequest, listing: nvml.GpuListing, environ: Mapping[str, str]
) -> tuple[GpuSelection | None, str | None]:
    try:
        return select_gpus(request, listing, dict(environ)), None
    except SettingError as err:
        return None, str(err)


def _environment_for_tensorflow(
    selection: GpuSelection | None, environ: Mapping[str, str]
) -> dict[str, str]:
    # TensorFlow must see exactly what training would give it.
    env = dict(environ)
    if selection is not None:
        apply_gpu_selection(selection, env)
    return env


def gather(
    request: GpuRequest,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    mixed_precision: str = "0",
    xla: bool = False,
    cross_device_ops: str = "auto",
    collect_tensorflow: Callable[[Mapping[str, str]], TfFacts] | None = None,
    collect_cuda: Callable[[Mapping[str, str]], CudaStack] | None = None,
) -> Facts:
    """Run every probe once. NVML and the host take milliseconds; TensorFlow seconds.

    `environ` is only read (TensorFlow and the CUDA library probe run in children with the
    selection applied). `with_tensorflow=False` (--no-tf) skips both.
    """
    environ = os.environ if environ is None else environ
    snapshot = nvml.snapshot()
    selection, selection_error = _select(request, snapshot.listing, environ)
    tf_facts = None
    cuda = None
    if with_tensorflow:
        child_environ = _environment_for_tensorflow(selection, environ)
        tf_facts = (collect_tensorflow or tfprobe.collect)(child_environ)
        cuda = (collect_cuda or cudalibs.collect)(child_environ)
    return Facts(
        request=request,
        nvml=snapshot,
        selection=selection,
        selection_error=selection_error,
        environ=probes.reported_environ(environ),
        host=probes.probe_host(),
        versions=probes.probe_versions(),
        tensorflow=tf_facts,
        mixed_precision=mixed_precision,
        cuda=cuda,
        xla=xla,
        cross_device_ops=cross_device_ops,
    )


def diagnose(
    request: GpuRequest,
    environ: Mapping[str, str] | None = None,
    *,
    with_tensorflow: bool = True,
    mixed_precision: str = "0",
    xla: bool = False,
    cross_device_ops: str = "auto",
    smoke: SmokeRequest | None = None,
) -> Report:
    """Gather the facts and judge them all; with `smoke`, also run the smoke job on the
    selected devices. Never raises for what it finds."""
    environ = os.environ if environ is None else environ
    facts = gather(
        request, environ, with_tensorflow=with_tensorflow, mixed_precision=mixed_precision,
        xla=xla, cross_device_ops=cross_device_ops,
    )
    smoke_result = None
    if smoke is not None:
        from mgpu_env.doctor import smoke as smoke_job

        smoke_result = smoke_job.run(
            smoke, _environment_for_tensorflow(facts.selection, environ), facts.selection
        )
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
    request: GpuRequest,
    environ: Mapping[str, str] | None = None,
    *,
    snapshot: nvml.NvmlSnapshot | None = None,
    tensorflow: TfFacts | None = None,
    cuda: CudaStack | None = None,
    cross_device_ops: str = "auto",
    strict: bool = False,
) -> list[Check]:
    """The checks that decide whether training can start; returns only the failing ones.

    Run it after `launch.choose_gpus` (the selection is in `environ`), right before the
    strategy is built. GPUS=none returns [] at once; with no GPU it asks only NVML
    (milliseconds). With GPUs it imports TensorFlow in this process (training does anyway)
    unless `tensorflow` facts are passed, and loads the CUDA libraries here (`cudalibs`:
    where TensorFlow will look, NCCL included) unless `cuda` is passed. `strict`: warnings
    fail too.
    """
    if request.kind == "none":
        return []
    environ = os.environ if environ is None else environ
    snapshot = nvml.snapshot() if snapshot is None else snapshot
    # Judge the user's request against NVML, as choose_gpus did (it leaves the environment
    # holding its own CUDA_VISIBLE_DEVICES, which is not a user preset for GPUS=all).
    user_environ = dict(environ)
    if request.kind != "all":
        user_environ.pop("CUDA_VISIBLE_DEVICES", None)
    selection, selection_error = _select(request, snapshot.listing, user_environ)
    if selection is not None and not selection.gpus:
        checks: tuple[CheckFunction, ...] = (check_nvml, check_request)
    else:
        checks = PREFLIGHT_CHECKS
        if tensorflow is None and selection is not None:
            tensorflow = tfprobe.collect_in_process()
        if cuda is None and selection is not None:
            cuda = cudalibs.collect_in_process(environ)
    facts = Facts(
        request=request,
        nvml=snapshot,
        selection=selection,
        selection_error=selection_error,
        environ=probes.reported_environ(user_environ),
        host=HostFacts(),
        versions={},
        tensorflow=tensorflow,
        cuda=cuda,
        cross_device_ops=cross_device_ops,
    )
    results = run_checks(facts, checks)
    return [c for c in results if c.status == "error" or (strict and c.status == "warn")]
