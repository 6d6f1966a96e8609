"""Every decision a command needs, made once from the resolved settings, before TensorFlow.

    runtime = build_runtime(resolved)    # NVML snapshot, GPU selection, device split,
                                         # precision, strategy plan, cluster, environment
    runtime.apply()                      # the process environment TensorFlow will read
    strategy = runtime.execution.start()  # TensorFlow: device split, precision, strategy

`mgpu train`, `mgpu bench` (the parent, and each child through `Execution`), the doctor's
pre-flight and `mgpu run` all take a `Runtime`; nothing downstream selects GPUs, splits
devices, picks a precision, an all-reduce or the Keras (`runtime/keras.py`) again.
Building it imports no TensorFlow, so a bad combination of settings fails in milliseconds
(ConfigError, exit 2).

`Execution` is the part another process needs to start TensorFlow the decided way (the
environment, the split, the precision, the strategy plan); it travels as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgpu_env.config.errors import RunFailed
from mgpu_env.config.resolve import ResolvedSettings, setting_error_message
from mgpu_env.config.settings import BY_ENV, SettingError, Settings, SettingsErrors
from mgpu_env.hardware import cpu, cudalibs, nvml
from mgpu_env.hardware.devices import (
    TF_DEVICE_TYPES,
    DeviceSplit,
    GpuSelection,
    apply_split,
    cuda_environment,
    plan_split,
    select_gpus,
    task_share,
)
from mgpu_env.hardware.nvml import GpuInfo
from mgpu_env.runtime.cluster import Cluster, decide_cluster
from mgpu_env.runtime.keras import (
    LEGACY_VARIABLE,
    Command,
    KerasChoice,
    choose_keras,
    tf_keras_installed,
)
from mgpu_env.runtime.precision import PrecisionChoice, choose_precision
from mgpu_env.runtime.strategy import (
    StrategyPlan,
    WorkerRole,
    nccl_possible,
    plan_strategy,
)

# TensorFlow's C++ INFO and WARNING lines (oneDNN, CPU features) bury the summary; they
# are hidden unless the user set TF_CPP_MIN_LOG_LEVEL.
DEFAULT_TF_LOG_LEVEL = "2"


@dataclass(frozen=True)
class Execution:
    """What a process needs to start TensorFlow as decided: sent to children as JSON."""

    environment: dict[str, str]  # variables to set before TensorFlow is imported
    split: DeviceSplit
    precision: PrecisionChoice
    strategy: StrategyPlan
    keras: KerasChoice  # which Keras tf.keras is; its TF_USE_LEGACY_KERAS is in environment

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Write the environment. Must run before TensorFlow is imported."""
        apply_environment(self.environment, os.environ if environ is None else environ)

    def prepare_tensorflow(self) -> None:
        """Split the devices and set the Keras precision policy (layers read it when built).

        Imports TensorFlow (quietly: `tfprobes.tfimport`); call once per process, before its
        runtime starts (the split is fixed then). Raises RunFailed when TensorFlow sees other
        devices than planned, or when its `tf.keras` is not the Keras decided (TensorFlow
        loaded its Keras before `apply()` wrote TF_USE_LEGACY_KERAS).
        """
        from mgpu_env.runtime.keras import tensorflow_keras_version
        from mgpu_env.runtime.precision import apply_precision
        from mgpu_env.tfprobes.tfimport import import_tensorflow

        import_tensorflow()
        try:
            apply_split(self.split)
        except RuntimeError as err:
            raise RunFailed(f"TensorFlow could not set up the devices: {err}") from None
        loaded = tensorflow_keras_version()
        if loaded != self.keras.version:
            raise RunFailed(
                f"tf.keras is Keras {loaded}, but Keras {self.keras.version} was decided "
                f"({self.keras.reason}): TensorFlow had loaded its Keras before "
                f"{LEGACY_VARIABLE} was set.\n  Fix: call mgpu_env.strategy() before the "
                f"script imports TensorFlow, or set KERAS={loaded}."
            )
        apply_precision(self.precision)

    def make_strategy(self) -> Any:
        """The tf.distribute strategy the plan describes (after `prepare_tensorflow`)."""
        from mgpu_env.runtime.strategy import make_strategy

        return make_strategy(self.strategy)

    def start(self) -> Any:
        """`prepare_tensorflow`, then the strategy: what a single-process user needs."""
        self.prepare_tensorflow()
        return self.make_strategy()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Execution:
        data = json.loads(text)
        split = DeviceSplit(**{**data["split"],
                               "memory_limit_mib": tuple(data["split"]["memory_limit_mib"])})
        plan = data["strategy"]
        role = WorkerRole(**plan.pop("role"))
        strategy = StrategyPlan(**{**plan, "devices": tuple(plan["devices"]), "role": role})
        keras = KerasChoice(**{**data["keras"], "notes": tuple(data["keras"]["notes"])})
        return cls(dict(data["environment"]), split, PrecisionChoice(**data["precision"]),
                   strategy, keras)


@dataclass(frozen=True)
class Runtime:
    """The resolved settings and everything decided from them and the machine."""

    resolved: ResolvedSettings
    nvml: nvml.NvmlSnapshot
    selection: GpuSelection
    cluster: Cluster | None
    execution: Execution
    cpu_flags: frozenset[str]  # the CPU's instruction sets (bf16 or not)
    nccl: bool  # NCCL can run between the selected GPUs
    notes: tuple[str, ...] = ()

    @property
    def settings(self) -> Settings:
        return self.resolved.settings

    @property
    def device_type(self) -> str:
        return self.execution.split.device_type

    @property
    def split(self) -> DeviceSplit:
        return self.execution.split

    @property
    def precision(self) -> PrecisionChoice:
        return self.execution.precision

    @property
    def strategy_plan(self) -> StrategyPlan:
        return self.execution.strategy

    @property
    def role(self) -> WorkerRole:
        return self.execution.strategy.role

    @property
    def replicas(self) -> int:
        """Every replica of the run: this process's devices times the workers."""
        return self.strategy_plan.local_replicas * self.role.num_workers

    @property
    def keras(self) -> KerasChoice:
        return self.execution.keras

    @property
    def environment(self) -> dict[str, str]:
        return self.execution.environment

    def cluster_description(self) -> dict[str, Any] | None:
        """`"cluster"` in the JSON outputs: engine, workers, index, chief; None for one
        process."""
        return None if self.cluster is None else self.cluster.describe()

    def cluster_line(self) -> str | None:
        """The cluster in one line for start summaries; None for one process."""
        cluster = self.cluster
        if cluster is None:
            return None
        chief = "the chief, writes the run" if self.role.is_chief else "writes nothing"
        line = (f"{cluster.engine_name}: worker {cluster.index} of {cluster.num_workers} "
                f"({cluster.address}; {chief})")
        if cluster.node is not None:
            tasks = cluster.node.tasks_on_node
            devices = f"{len(self.selection.gpus)} GPU(s)" if self.selection.gpus else "the CPU"
            line += (f"; one task on this node, with {devices}" if tasks == 1 else
                     f"; {tasks} tasks on this node, this one with {devices}")
        return line

    def compute_capabilities(self) -> list[tuple[int, int] | None]:
        return [gpu.compute_capability.value for gpu in self.selection.gpus]

    def execution_for(
        self, gpus: Sequence[GpuInfo], cuda_visible_devices: str | None, *,
        virtual_devices: int, mixed_precision: str,
    ) -> Execution:
        """Another process's execution on some of this runtime's GPUs (a `mgpu bench`
        point): the same rules and settings, other devices or precision."""
        return decide_execution(
            {k: v for k, v in self.environment.items()
             if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", TF_DEVICE_TYPES)},
            gpus, cuda_visible_devices, virtual_devices=virtual_devices,
            mixed_precision=mixed_precision,
            cross_device_ops=self.settings.cross_device_ops,
            cpu_flags=self.cpu_flags, nccl=self.nccl and bool(gpus), keras=self.keras,
        )

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Write the decided environment (GPUs, TF_CONFIG, the settings file's extras).

        The one place mgpu changes the process environment; before TensorFlow is imported.
        """
        self.execution.apply(environ)


def apply_environment(environment: Mapping[str, str], environ: MutableMapping[str, str]) -> None:
    environ.update(environment)


def _select(resolved: ResolvedSettings, listing: nvml.GpuListing,
            environ: Mapping[str, str], cluster: Cluster | None) -> GpuSelection:
    """GPUS on this machine; this task's share of them when an engine started several
    tasks here (Slurm's tasks per node)."""
    request = resolved.settings.gpus
    try:
        selection = select_gpus(request, listing, environ)
        if cluster is None or cluster.node is None:
            return selection
        return task_share(selection, cluster.node.local_id, cluster.node.tasks_on_node,
                          len(listing.gpus))
    except SettingError as err:
        raise SettingsErrors(
            [setting_error_message(BY_ENV["GPUS"], str(request),
                                   resolved.sources.get("GPUS", "default"), str(err))]
        ) from None


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
    cpu_flags: frozenset[str] | None = None,
    nccl: bool | None = None,
    tf_keras: bool | None = None,
    keras_2_code: str | None = None,
) -> Runtime:
    """Decide everything once. Asks NVML (unless GPUS=none); imports no TensorFlow.

    `command` says whose code uses Keras: "run" (a user's script: `mgpu run`, or the API
    from plain python), "train" or "bench" (mgpu's own); it decides KERAS=auto between
    workers. Raises SettingsErrors (a GPU the machine lacks) or ConfigError (settings that
    cannot work together here): both exit 2. `snapshot`, `cpu_flags`, `nccl` and `tf_keras`
    (tf_keras is installed) replace the probes (tests, or a caller that already has them).
    `keras_2_code`: what in `mgpu run`'s script only Keras 2 has (`runtime.source_scan`), for
    KERAS=auto.
    """
    environ = os.environ if environ is None else environ
    settings = resolved.settings
    if snapshot is None:
        snapshot = (
            nvml.NvmlSnapshot(nvml.GpuListing()) if settings.gpus.kind == "none"
            else nvml.snapshot()
        )
    decision = decide_cluster(settings, environ)
    cluster = decision.cluster
    selection = _select(resolved, snapshot.listing, environ, cluster)
    cpu_flags = cpu.cpu_flags() if cpu_flags is None else cpu_flags
    nccl = nccl_available(selection.gpus) if nccl is None else nccl
    notes = [*decision.notes, *([selection.note] if selection.note else [])]
    virtual_devices, note = _usable_virtual_devices(settings.virtual_devices, cluster,
                                                    selection)
    notes.extend(note)
    environment = _process_environment(resolved, environ, cluster)
    # The user's own TF_USE_LEGACY_KERAS: the process environment, else the settings file.
    user_legacy = environ.get(LEGACY_VARIABLE, resolved.env_file_values.get(LEGACY_VARIABLE))
    keras = choose_keras(
        settings.keras, multi_worker=cluster is not None, command=command,
        user_legacy=user_legacy,
        tf_keras_available=tf_keras_installed() if tf_keras is None else tf_keras,
        keras_2_code=keras_2_code,
    )
    notes.extend(keras.notes)
    environment.update(keras.environment(user_legacy))
    execution = decide_execution(
        environment, selection.gpus, selection.cuda_visible_devices,
        virtual_devices=virtual_devices, mixed_precision=settings.mixed_precision,
        cross_device_ops=settings.cross_device_ops,
        role=cluster.role if cluster is not None else None,
        cpu_flags=cpu_flags, nccl=nccl, keras=keras,
    )
    return Runtime(
        resolved, snapshot, selection, cluster, execution, cpu_flags, nccl, tuple(notes)
    )


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


def decide_execution(
    base_environment: Mapping[str, str],
    gpus: Sequence[GpuInfo],
    cuda_visible_devices: str | None,
    *,
    virtual_devices: int,
    mixed_precision: str,
    cross_device_ops: str,
    role: WorkerRole | None = None,
    cpu_flags: frozenset[str],
    nccl: bool,
    keras: KerasChoice,
) -> Execution:
    """The device split, precision and strategy for these GPUs (none: the CPU), each by its
    one rule. `build_runtime` calls it for the run; `Runtime.execution_for` for a subset."""
    split = plan_split(virtual_devices, gpus)
    precision = choose_precision(
        mixed_precision, split.device_type,
        [gpu.compute_capability.value for gpu in gpus], cpu_flags,
    )
    strategy = plan_strategy(
        cross_device_ops, split.names, split.device_type, split.physical,
        nccl_available=nccl, role=role,
    )
    environment = {
        **base_environment, **cuda_environment(cuda_visible_devices, uses_gpu=bool(gpus))
    }
    return Execution(environment, split, precision, strategy, keras)
