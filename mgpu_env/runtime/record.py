"""The decisions as one record, part by part.

`decide` makes each part of the runtime by its
one rule (the cluster, the GPUs, the Keras, the device split, the precision, the
all-reduce) and keeps why a part could not be made, so the doctor judges the settings from
the same record training starts from (`Decisions.runtime()`, which `decide_runtime` and
`build_runtime` return). Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import ResolvedSettings, setting_error_message
from mgpu_env.config.settings import BY_ENV, SettingError, SettingsErrors
from mgpu_env.hardware import cudalibs, nvml
from mgpu_env.hardware.devices import (
    DeviceSplit,
    GpuSelection,
    cuda_environment,
    plan_split,
    select_gpus,
    task_share,
)
from mgpu_env.hardware.nvml import GpuInfo
from mgpu_env.runtime.cluster import Cluster, ClusterDecision, decide_cluster
from mgpu_env.runtime.decisions import DecidedParts, Machine, Runtime, probe_machine
from mgpu_env.runtime.execution import DEFAULT_TF_LOG_LEVEL, Execution
from mgpu_env.runtime.keras import LEGACY_VARIABLE, Command, KerasChoice, KerasFound, choose_keras
from mgpu_env.runtime.precision import PrecisionChoice, choose_precision
from mgpu_env.runtime.strategy import StrategyPlan, nccl_possible, plan_strategy

T = TypeVar("T")


def _select(resolved: ResolvedSettings, listing: nvml.GpuListing,
            environ: Mapping[str, str], cluster: Cluster | None) -> GpuSelection:
    """GPUS on this machine; this task's share of them when an engine started several
    tasks here (Slurm's tasks per node). Raises SettingError with the reason alone (the
    doctor shows it beside the request; `Decisions.runtime()` words it as a bad setting)."""
    selection = select_gpus(resolved.settings.gpus, listing, environ)
    if cluster is None or cluster.node is None:
        return selection
    return task_share(selection, cluster.node.local_id, cluster.node.tasks_on_node,
                      len(listing.gpus))


def nccl_available(gpus: Sequence[GpuInfo]) -> bool:
    """Whether NCCL can run here: GPUs selected, on Linux, and libnccl.so.2 really loads
    from where TensorFlow looks for it (TensorFlow opens it only at the first NCCL
    all-reduce, so a missing library would otherwise fail the run there)."""
    return bool(gpus) and nccl_possible() and cudalibs.nccl_loadable()


def build_runtime(
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    command: Command,
    snapshot: nvml.NvmlSnapshot | None = None,
    keras_2_code: str | None = None,
) -> Runtime:
    """Decide everything once, on this machine (`probe_machine`; `snapshot` replaces
    NVML's): `decide_runtime`. Imports no TensorFlow."""
    machine = probe_machine(resolved.settings, environ, snapshot=snapshot)
    return decide_runtime(resolved, machine, command=command, keras_2_code=keras_2_code)


def decide_runtime(
    resolved: ResolvedSettings, machine: Machine, *, command: Command,
    keras_2_code: str | None = None,
) -> Runtime:
    """Decide everything once from the settings and the machine's facts; imports no
    TensorFlow.

    `command` says whose code uses Keras: "run" (a user's script: `mgpu run`, or the API
    from plain python), "train" or "bench" (mgpu's own); it decides KERAS=auto between
    workers. Raises SettingsErrors (a GPU the machine lacks) or ConfigError (settings that
    cannot work together here): both exit 2. `keras_2_code`: what in `mgpu run`'s script
    only Keras 2 has (`launcher.source_scan`), for KERAS=auto.
    """
    return decide(resolved, machine, command=command, keras_2_code=keras_2_code).runtime()


# The parts of the runtime, in the order they are decided; a part that fails names itself
# here, and `Decisions.runtime()` raises the first failure in this order.
Part = Literal["cluster", "gpus", "keras", "devices", "precision", "strategy"]
PARTS: tuple[Part, ...] = ("cluster", "gpus", "keras", "devices", "precision", "strategy")


@dataclass(frozen=True)
class Decisions:
    """Every decision the settings made on this machine, part by part, with why each part
    that could not be decided failed: the doctor judges this record, training and the bench
    take its `runtime()`. A part that needs a failed one is left undecided (None) without a
    failure of its own; a failed cluster leaves the rest decided as for one process."""

    resolved: ResolvedSettings
    machine: Machine
    command: Command
    cluster: ClusterDecision | None
    selection: GpuSelection | None
    keras: KerasChoice | None
    split: DeviceSplit | None
    precision: PrecisionChoice | None
    strategy_plan: StrategyPlan | None
    nccl: bool
    environment: dict[str, str]
    notes: tuple[str, ...]
    failures: Mapping[Part, SettingError | ConfigError]

    def error(self, part: Part) -> str | None:
        """Why `part` could not be decided (for the GPUs, the reason alone); None when it
        was, or when a part it needs failed."""
        failure = self.failures.get(part)
        if failure is None:
            return None
        if isinstance(failure, SettingsErrors):
            return "\n".join(failure.errors)
        return str(failure)

    def _refusal(self, part: Part) -> ConfigError:
        """The failure of `part` as training raises it: a bad GPUS as SettingsErrors naming
        the setting, its value and where it came from."""
        failure = self.failures[part]
        if isinstance(failure, ConfigError):
            return failure
        request = self.resolved.settings.gpus
        return SettingsErrors([setting_error_message(
            BY_ENV["GPUS"], str(request), self.resolved.sources.get("GPUS", "default"),
            str(failure))])

    def decided(self) -> dict[str, Any]:
        """What was decided, as every command states it (`DecidedParts.describe`), and why
        each part that failed did (`"errors"`, by part)."""
        cluster = self.cluster.cluster if self.cluster is not None else None
        return {**DecidedParts(self.selection, self.split, self.precision,
                               self.strategy_plan, cluster, self.keras).describe(),
                "errors": {part: self.error(part) for part in self.failures}}

    def keras_for(self, command: Command) -> KerasChoice:
        """The Keras another command would get from the same settings and machine (the
        doctor reports a script's beside mgpu's own loop's). Raises ConfigError as the
        keras part does."""
        cluster = self.cluster.cluster if self.cluster is not None else None
        return decide_keras(self.resolved, self.machine, cluster, command)

    def runtime(self) -> Runtime:
        """The runtime, when every part was decided; else raises the first part's failure
        (a ConfigError, SettingsErrors for GPUS: exit 2)."""
        for part in PARTS:
            if part in self.failures:
                raise self._refusal(part)
        assert self.selection is not None and self.keras is not None  # no failure: decided
        assert self.split is not None and self.precision is not None
        assert self.strategy_plan is not None and self.cluster is not None
        environment = {
            **self.environment,
            **cuda_environment(self.selection.cuda_visible_devices,
                               uses_gpu=bool(self.selection.gpus)),
        }
        execution = Execution(environment, self.split, self.precision, self.strategy_plan,
                              self.keras)
        return Runtime(self.resolved, self.machine.snapshot, self.selection,
                       self.cluster.cluster, execution, self.machine.cpu_flags, self.nccl,
                       self.notes)


def decide(
    resolved: ResolvedSettings, machine: Machine, *, command: Command,
    keras_2_code: str | None = None,
) -> Decisions:
    """Decide each part of the runtime (`PARTS`, in order) by its one rule, keeping what
    each decided or why it could not; imports no TensorFlow. `decide_runtime` is this
    record's `runtime()`; the doctor reads the record itself."""
    settings, environ = resolved.settings, machine.environ
    failures: dict[Part, SettingError | ConfigError] = {}

    def attempt(part: Part, rule: Callable[[], T]) -> T | None:
        try:
            return rule()
        except (SettingError, ConfigError) as err:
            failures[part] = err
            return None

    decision = attempt("cluster", lambda: decide_cluster(settings, environ))
    cluster = decision.cluster if decision is not None else None
    selection = attempt("gpus", lambda: _select(resolved, machine.snapshot.listing, environ,
                                                cluster))
    gpus = selection.gpus if selection is not None else ()
    nccl = nccl_available(gpus) if machine.nccl is None else machine.nccl
    notes = [*(decision.notes if decision is not None else ()),
             *([selection.note] if selection is not None and selection.note else [])]
    environment = _process_environment(resolved, environ, cluster)
    keras = attempt("keras", lambda: decide_keras(resolved, machine, cluster, command,
                                                  keras_2_code))
    if keras is not None:
        notes.extend(keras.notes)
        environment.update(keras.environment(_user_legacy(resolved, environ)))
    split = precision = strategy_plan = None
    if selection is not None:
        virtual_devices, note = _usable_virtual_devices(settings.virtual_devices, cluster,
                                                        selection)
        notes.extend(note)
        split = attempt("devices", lambda: plan_split(virtual_devices, gpus))
    if split is not None:
        capabilities = [gpu.compute_capability.value for gpu in gpus]
        precision = attempt("precision", lambda: choose_precision(
            settings.mixed_precision, split.device_type, capabilities, machine.cpu_flags))
        role = cluster.role if cluster is not None else None
        strategy_plan = attempt("strategy", lambda: plan_strategy(
            settings.cross_device_ops, split,
            nccl_available=nccl, role=role))
    return Decisions(resolved, machine, command, decision, selection, keras, split,
                     precision, strategy_plan, nccl, environment, tuple(notes), failures)


def _user_legacy(resolved: ResolvedSettings, environ: Mapping[str, str]) -> str | None:
    """The user's own TF_USE_LEGACY_KERAS: the process environment, else the settings file."""
    return environ.get(LEGACY_VARIABLE, resolved.env_file_values.get(LEGACY_VARIABLE))


def decide_keras(
    resolved: ResolvedSettings, machine: Machine, cluster: Cluster | None, command: Command,
    keras_2_code: str | None = None,
) -> KerasChoice:
    """KERAS for `command` in this cluster (None: one process), by `choose_keras`, with the
    user's TF_USE_LEGACY_KERAS and whether tf_keras is installed as the machine says."""
    found = KerasFound(_user_legacy(resolved, machine.environ), machine.tf_keras, keras_2_code)
    return choose_keras(resolved.settings.keras, found, multi_worker=cluster is not None,
                        command=command)


def _usable_virtual_devices(
    virtual_devices: int, cluster: Cluster | None, selection: GpuSelection
) -> tuple[int, list[str]]:
    """VIRTUAL_DEVICES as the run can use it, with a note when it cannot."""
    if cluster is not None and not selection.gpus and virtual_devices >= 2:
        # MultiWorkerMirroredStrategy mirrors over every local GPU, or over one CPU device:
        # it never uses logical CPU devices, so splitting the CPU would only miscount the
        # replicas (and the global batch).
        return 0, [
            f"VIRTUAL_DEVICES={virtual_devices} is not used between workers on the CPU: "
            "MultiWorkerMirroredStrategy runs one replica per worker there"
        ]
    return virtual_devices, []


def _process_environment(
    resolved: ResolvedSettings, environ: Mapping[str, str], cluster: Cluster | None
) -> dict[str, str]:
    """The variables the run's process gets on top of `environ` (Keras' come later)."""
    environment: dict[str, str] = {}
    if cluster is not None:
        # TensorFlow reads only the process environment; TF_CONFIG may have come from the
        # settings file or a flag, or been built from WORKER_HOSTS.
        environment["TF_CONFIG"] = cluster.tf_config()
    # The settings file's other variables (NCCL_*, ...): the process environment wins, as
    # with docker compose's env_file.
    for key, value in resolved.env_file_values.items():
        if key not in BY_ENV and key not in environ:
            environment[key] = value
    if "TF_CPP_MIN_LOG_LEVEL" not in environ and "TF_CPP_MIN_LOG_LEVEL" not in environment:
        environment["TF_CPP_MIN_LOG_LEVEL"] = DEFAULT_TF_LOG_LEVEL
    return environment
