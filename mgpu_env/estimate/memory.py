"""Each device's memory for a model and a batch, before training: what a replica holds.

- weights: every variable of the model at its dtype (under Keras' mixed precision the
  variables stay float32: they are the float32 master weights);
- the compute copy of the weights under mixed precision (each layer casts its float32
  weights to float16 or bfloat16 for the step: half their size again);
- gradients: one per trainable variable, at its dtype (they are all-reduced as such);
- the optimizer's slots: Adam keeps two (m and v), SGD with momentum one, plain SGD none,
  each the size of its variable;
- activations: every layer's outputs at the batch per replica, in the compute dtype, kept
  for the backward pass (an upper bound for layers whose outputs are not all kept, a
  lower one for ops that keep more than their output).

The fixed part (all but the activations) does not grow with the batch; the activations grow
linearly with it, so the largest batch per replica that fits is one division. Compare with
the GPU's total memory from NVML, less USABLE_FRACTION for the CUDA context, cuDNN's and
XLA's workspaces and the allocator's fragmentation.

`measure` (a built model: the estimate's parts) and `compare` (against NVML's GPUs: the
summary's lines, or the refusal) are apart, so the model can be measured in another process
(`training.step.memprobe`) than the one that compares; `device_peaks` reads what a step
really took, to set beside the estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.estimate.allreduce import DTYPE_BYTES
from mgpu_env.hardware.nvml import GpuInfo

# The share of a GPU's memory a step can count on: the CUDA context (300-500 MB), cuDNN's
# and cuBLAS' workspaces and the BFC allocator's fragmentation take the rest.
USABLE_FRACTION = 0.85
# The dtype a Keras policy computes in (its variables stay float32).
COMPUTE_DTYPE = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
SLOTS = {"adam": 2, "adamw": 2, "rmsprop": 1, "sgd_momentum": 1, "sgd": 0}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one replica holds, by part, at `per_replica_batch`."""

    per_replica_batch: int
    weights: int
    compute_copy: int
    gradients: int
    slots: int
    activations: int

    @property
    def fixed(self) -> int:
        """What does not grow with the batch."""
        return self.weights + self.compute_copy + self.gradients + self.slots

    @property
    def total(self) -> int:
        return self.fixed + self.activations

    def largest_batch(self, device_bytes: int) -> int:
        """The largest batch per replica whose estimate fits USABLE_FRACTION of
        `device_bytes` (0: not even the weights fit)."""
        room = int(device_bytes * USABLE_FRACTION) - self.fixed
        per_sample = self.activations / max(self.per_replica_batch, 1)
        if room <= 0:
            return 0
        return int(room // per_sample) if per_sample > 0 else self.per_replica_batch

    def fits(self, device_bytes: int) -> bool:
        return self.total <= device_bytes * USABLE_FRACTION

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryEstimate:
        """The estimate `as_dict` wrote (its `total` is derived, so not read)."""
        return cls(**{name: int(data[name]) for name in (
            "per_replica_batch", "weights", "compute_copy", "gradients", "slots",
            "activations")})

    def as_dict(self) -> dict[str, int]:
        return {"per_replica_batch": self.per_replica_batch, "weights": self.weights,
                "compute_copy": self.compute_copy, "gradients": self.gradients,
                "slots": self.slots, "activations": self.activations, "total": self.total}


def variable_bytes(variables: Iterable[Any]) -> int:
    """The bytes of these variables at their own dtypes."""
    total = 0
    for variable in variables:
        elements = 1
        for dim in variable.shape:
            elements *= int(dim)
        total += elements * DTYPE_BYTES[str(getattr(variable.dtype, "name", variable.dtype))]
    return total


def optimizer_slots(optimizer: Any) -> int:
    """How many slots per trainable variable `optimizer` keeps (SLOTS, by its class); a
    LossScaleOptimizer (fp16) keeps its inner optimizer's."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    name = type(optimizer).__name__.lower()
    if name == "sgd":
        return SLOTS["sgd_momentum"] if float(getattr(optimizer, "momentum", 0)) else 0
    if name not in SLOTS:
        known = ", ".join(sorted(SLOTS))
        raise ValueError(f"no slot count for optimizer {type(optimizer).__name__}; known: "
                         f"{known}")
    return SLOTS[name]


def activation_elements(model: Any) -> int:
    """Elements of every layer's outputs for one sample (the batch dimension left out). A
    layer with no output yet (a subclassed model's, before it runs) counts none."""
    total = 0
    for layer in model.layers:
        if type(layer).__name__ == "InputLayer":
            continue
        try:
            output = layer.output
        except (AttributeError, ValueError):  # Keras: "has never been called"
            continue
        outputs = output if isinstance(output, list | tuple) else [output]
        for output in outputs:
            elements = 1
            for dim in tuple(output.shape)[1:]:
                elements *= int(dim) if dim is not None else 1
            total += elements
    return total


def estimate(model: Any, slots_per_variable: int, per_replica_batch: int,
             compute_dtype: str = "float32") -> MemoryEstimate:
    """The estimate for a built Keras `model`, an optimizer keeping `slots_per_variable`
    slots (`optimizer_slots`), at `per_replica_batch`, computing in `compute_dtype`."""
    trainable = variable_bytes(model.trainable_variables)
    weights = variable_bytes(model.variables)
    mixed = compute_dtype in ("float16", "bfloat16")
    compute_bytes = DTYPE_BYTES[compute_dtype]
    return MemoryEstimate(
        per_replica_batch=per_replica_batch,
        weights=weights,
        compute_copy=weights // 2 if mixed else 0,
        gradients=trainable,
        slots=slots_per_variable * trainable,
        activations=activation_elements(model) * compute_bytes * per_replica_batch,
    )


def refusal(estimate_: MemoryEstimate, device_bytes: int, device: str) -> str | None:
    """Why this batch cannot fit on `device` (None when it fits): the estimate, the memory,
    and the largest batch per replica that fits."""
    if estimate_.fits(device_bytes):
        return None
    largest = estimate_.largest_batch(device_bytes)
    fix = (f"BATCH_SIZE={largest} or less (the largest batch per replica that fits)"
           if largest else "a smaller model, or a GPU with more memory: the weights, "
           "gradients and optimizer slots alone do not fit")
    return (f"BATCH_SIZE={estimate_.per_replica_batch} needs about "
            f"{estimate_.total / 2**30:.1f} GiB per replica (weights, gradients, optimizer "
            f"slots and activations), but {device} has {device_bytes / 2**30:.1f} GiB "
            f"({100 * USABLE_FRACTION:.0f}% usable).\n  Fix: {fix}.")


def measure(model: Any, optimizer: Any, per_replica_batch: int, policy: str
            ) -> tuple[MemoryEstimate, str]:
    """The estimate for a built model and optimizer under the Keras `policy`, and what it
    had to assume (empty, or ", ..." clauses for the summary's line): an optimizer of the
    user's is taken as Adam, a model whose layers have no outputs yet has no activations."""
    try:
        slots, assumed = optimizer_slots(optimizer), ""
    except ValueError:  # an optimizer of the user's: Adam's two slots, said so
        slots, assumed = SLOTS["adam"], f", {type(optimizer).__name__}'s slots taken as Adam's"
    found = estimate(model, slots, per_replica_batch, COMPUTE_DTYPE[policy])
    if not found.activations:
        assumed += ", activations unknown: the model's layers have no outputs before it runs"
    return found, assumed


def compare(found: MemoryEstimate, assumed: str, gpus: Sequence[GpuInfo]) -> list[str]:
    """A line for the start summary, and one per GPU against NVML's total memory (none on
    CPUs: their memory is the host's). Raises ConfigError (exit 2) with the largest batch
    that fits when a GPU is too small."""
    lines = [f"memory per replica: about {size_text(found.total)} (weights "
             f"{size_text(found.weights)}, gradients {size_text(found.gradients)}, optimizer slots "
             f"{size_text(found.slots)}, activations {size_text(found.activations)} at batch "
             f"{found.per_replica_batch}{assumed})"]
    for gpu in gpus:
        if not (gpu.memory_total_mib.ok and gpu.memory_total_mib.value):
            continue
        device_bytes = gpu.memory_total_mib.value * 2**20
        why = refusal(found, device_bytes, f"GPU {gpu.index} ({gpu.name})")
        if why is not None:
            raise ConfigError(why)
        lines.append(f"GPU {gpu.index}: {100 * found.total / device_bytes:.0f}% of its "
                     f"{device_bytes / 2**30:.1f} GiB; the largest batch per replica that fits "
                     f"is about {found.largest_batch(device_bytes):,}")
    return lines


def device_peaks(devices: Iterable[str],
                 read: Callable[[str], dict[str, int]] | None = None) -> dict[str, int] | None:
    """Each GPU's peak memory so far, by TensorFlow's allocator
    (`tf.config.experimental.get_memory_info(device)["peak"]`), keyed "GPU:0"; None where
    none of `devices` (TensorFlow device names) is a GPU: CPUs keep no such count. A GPU
    whose count cannot be read is left out, not a failure. `read`: the probe (tests)."""
    gpus = [name.rsplit("/device:", 1)[-1] for name in devices]
    gpus = [name for name in gpus if name.upper().startswith("GPU")]
    if not gpus:
        return None
    if read is None:
        import tensorflow as tf

        read = tf.config.experimental.get_memory_info
    peaks = {}
    for name in gpus:
        try:
            peaks[name] = int(read(name)["peak"])
        except (ValueError, RuntimeError):  # could not collect: left out
            continue
    return peaks


def size_text(size_bytes: int) -> str:
    """Bytes as the summaries write them: KiB below 1 MiB, MiB, or GiB from 1 GiB."""
    if size_bytes >= 2**30:
        return f"{size_bytes / 2**30:.1f} GiB"
    return (f"{size_bytes / 2**20:.1f} MiB" if size_bytes >= 2**20
            else f"{size_bytes / 2**10:.1f} KiB")
