"""The runtime's decisions as training reads them.

They are the `Runtime`, the machine's facts they are made from (`Machine`, `probe_machine`),
and a process's execution on some of the GPUs (`decide_execution`). `record.decide` makes
them; nothing downstream decides them again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgpu_env.config.resolve import ResolvedSettings
from mgpu_env.config.settings import Settings
from mgpu_env.hardware import cpu, nvml
from mgpu_env.hardware.devices import (
    TF_DEVICE_TYPES,
    DeviceSplit,
    GpuSelection,
    cuda_environment,
    plan_split,
)
from mgpu_env.hardware.nvml import GpuInfo
from mgpu_env.runtime.cluster import Cluster
from mgpu_env.runtime.execution import Execution
from mgpu_env.runtime.keras import (
    KerasChoice,
    tf_keras_installed,
)
from mgpu_env.runtime.precision import PrecisionChoice, choose_precision
from mgpu_env.runtime.strategy import (
    StrategyPlan,
    WorkerRole,
    plan_strategy,
)


def global_batch_size(per_replica_batch: int, replicas: int) -> int:
    """BATCH_SIZE is each replica's batch, as in TensorFlow's tutorial; a step takes it on
    every replica of the run (every worker's), so adding replicas adds samples per step."""
    return per_replica_batch * replicas


@dataclass(frozen=True)
class DecidedParts:
    """The parts every command states alike; None where a part was not decided (the
    runtime's are all decided, a failed record's not)."""

    selection: GpuSelection | None
    split: DeviceSplit | None
    precision: PrecisionChoice | None
    strategy_plan: StrategyPlan | None
    cluster: Cluster | None
    keras: KerasChoice | None

    def describe(self) -> dict[str, Any]:
        """`"decisions"` in `mgpu doctor --json`, `mgpu train --dry-run --json` and `mgpu
        bench --dry-run --json`: the GPUs (NVML indices), the devices and replicas, the
        precision, the cluster and the Keras, in one shape; null where not decided."""
        selection, split, precision = self.selection, self.split, self.precision
        strategy_plan, cluster, keras = self.strategy_plan, self.cluster, self.keras
        return {
            "gpus": None if selection is None else [gpu.index for gpu in selection.gpus],
            "device_type": None if split is None else split.device_type,
            "devices": None if split is None else list(split.names),
            "replicas": None if strategy_plan is None else
            strategy_plan.local_replicas * strategy_plan.role.num_workers,
            "precision": None if precision is None else precision.policy,
            "cluster": None if cluster is None else cluster.describe(),
            "keras": None if keras is None else keras.version,
        }


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
        return self.execution.strategy_plan

    @property
    def role(self) -> WorkerRole:
        return self.execution.strategy_plan.role

    @property
    def replicas(self) -> int:
        """Every replica of the run: this process's devices times the workers."""
        return self.strategy_plan.local_replicas * self.role.num_workers

    @property
    def global_batch_size(self) -> int:
        """The batch of one step over every replica of the run (`global_batch_size`)."""
        return global_batch_size(self.settings.batch_size, self.replicas)

    @property
    def keras(self) -> KerasChoice:
        return self.execution.keras

    @property
    def environment(self) -> dict[str, str]:
        return self.execution.environment

    def decided(self) -> dict[str, Any]:
        """The decisions every command states alike (`DecidedParts.describe`)."""
        return DecidedParts(self.selection, self.split, self.precision,
                            self.strategy_plan, self.cluster, self.keras).describe()

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

    def execution_for(
        self, gpus: Sequence[GpuInfo], cuda_visible_devices: str | None, *,
        virtual_devices: int, mixed_precision: str,
    ) -> Execution:
        """Another process's execution on some of this runtime's GPUs (a `mgpu bench`
        point): the same rules and settings, other devices or precision."""
        base = {k: v for k, v in self.environment.items()
                if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", TF_DEVICE_TYPES)}
        request = ExecutionRequest(virtual_devices, mixed_precision,
                                   self.settings.cross_device_ops, self.keras, base)
        return decide_execution(gpus, cuda_visible_devices, request, self.cpu_flags,
                                self.nccl and bool(gpus))

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Write the decided environment (GPUs, TF_CONFIG, the settings file's extras).

        The one place mgpu changes the process environment; before TensorFlow is imported.
        """
        self.execution.apply(environ)


@dataclass(frozen=True)
class Machine:
    """The machine's facts the decisions read, as one object: NVML's snapshot of the GPUs,
    the CPU's instruction sets, whether NCCL loads (None: asked for the GPUs selected),
    whether tf_keras is installed, and the process environment. `probe_machine` asks the
    machine; tests and callers that have them pass canned ones."""

    environ: Mapping[str, str]
    snapshot: nvml.NvmlSnapshot
    cpu_flags: frozenset[str]
    tf_keras: bool
    nccl: bool | None = None


def probe_machine(
    settings: Settings, environ: Mapping[str, str] | None = None, *,
    snapshot: nvml.NvmlSnapshot | None = None,
) -> Machine:
    """Ask the machine: NVML (not at all with GPUS=none), the CPU's flags, tf_keras."""
    if snapshot is None:
        snapshot = (
            nvml.NvmlSnapshot(nvml.GpuListing()) if settings.gpus.kind == "none"
            else nvml.snapshot()
        )
    return Machine(os.environ if environ is None else environ, snapshot, cpu.cpu_flags(),
                   tf_keras_installed())


@dataclass(frozen=True)
class ExecutionRequest:
    """What a process asks of its devices besides which GPUs: the settings' VIRTUAL_DEVICES,
    MIXED_PRECISION and CROSS_DEVICE_OPS, its role in a cluster, the Keras decided, and the
    environment it starts with (CUDA's variables are added for its GPUs)."""

    virtual_devices: int
    mixed_precision: str
    cross_device_ops: str
    keras: KerasChoice
    base_environment: Mapping[str, str]
    role: WorkerRole | None = None


def decide_execution(
    gpus: Sequence[GpuInfo], cuda_visible_devices: str | None, request: ExecutionRequest,
    cpu_flags: frozenset[str], nccl: bool,
) -> Execution:
    """The device split, precision and strategy for these GPUs (none: the CPU), each by its
    one rule, on a CPU with `cpu_flags` where NCCL runs or not. `decide_runtime` calls it for
    the run; `Runtime.execution_for` for a subset."""
    split = plan_split(request.virtual_devices, gpus)
    precision = choose_precision(
        request.mixed_precision, split.device_type,
        [gpu.compute_capability.value for gpu in gpus], cpu_flags,
    )
    strategy = plan_strategy(
        request.cross_device_ops, split,
        nccl_available=nccl, role=request.role,
    )
    environment = {
        **request.base_environment,
        **cuda_environment(cuda_visible_devices, uses_gpu=bool(gpus)),
    }
    return Execution(environment, split, precision, strategy, request.keras)
