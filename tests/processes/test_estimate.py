"""The all-reduce predicted and each replica's memory estimated: the arithmetic on sizes
(no TensorFlow), then against real Keras models' variables (logical CPU devices)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.estimate import allreduce, memory
from mgpu_env.hardware.nvml import GpuInfo, Probed

MIB = 1 << 20


def _check_devices(model: Any, optimizer: Any, per_replica_batch: int, policy: str,
                   gpus: list[GpuInfo]) -> tuple[memory.MemoryEstimate, list[str]]:
    """What `mgpu train`'s check does with the child's answer, in this process: `measure`
    then `compare`."""
    found, assumed = memory.measure(model, optimizer, per_replica_batch, policy)
    return found, memory.compare(found, assumed, gpus)


@pytest.mark.parametrize(("replicas", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_the_ring_moves_2_n_minus_1_over_n_times_the_bytes(replicas: int, factor: float
                                                            ) -> None:
    # 100 MB at a bus bandwidth of 100 GB/s: 1 ms per 2(n-1)/n.
    assert allreduce.ring_seconds(100_000_000, replicas, 100.0) == pytest.approx(
        factor * 1e-3)


def test_a_bus_bandwidth_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        allreduce.ring_seconds(1, 2, 0.0)


SWEEP = [(1 * MIB, 2.0), (16 * MIB, 8.0), (64 * MIB, 10.0)]


@pytest.mark.parametrize(("size", "nearest"), [(200_000, 1 * MIB), (3 * MIB, 1 * MIB),
                                               (5 * MIB, 16 * MIB), (100 * MIB, 64 * MIB)])
def test_the_sweeps_size_nearest_the_gradients_gives_the_bandwidth(size: int, nearest: int
                                                                    ) -> None:
    assert allreduce.nearest_bandwidth(SWEEP, size) == dict(
        (s, (s, g)) for s, g in SWEEP)[nearest]


def test_the_sweep_comes_first_then_the_link_class_then_none() -> None:
    from_sweep = allreduce.predict(16 * MIB, 2, SWEEP, (25.0, "NVLink 3 x1"))
    assert from_sweep.bus_gbps == 8.0 and "busbw sweep" in from_sweep.bus_source
    assert from_sweep.seconds == pytest.approx(16 * MIB / 8e9)
    from_link = allreduce.predict(16 * MIB, 2, (), (25.0, "NVLink 3 x1"))
    assert from_link.bus_gbps == 25.0 and from_link.bus_source == "NVML link class: NVLink 3 x1"
    neither = allreduce.predict(16 * MIB, 2)
    assert neither.seconds is None and "no bus bandwidth" in neither.bus_source
    assert allreduce.predict(16 * MIB, 1, SWEEP).seconds == 0.0


def sized(per_sample_activations: int, batch: int) -> memory.MemoryEstimate:
    return memory.MemoryEstimate(batch, weights=100 * MIB, compute_copy=0,
                                 gradients=100 * MIB, slots=200 * MIB,
                                 activations=per_sample_activations * batch)


def test_the_largest_batch_fills_the_usable_memory() -> None:
    estimate = sized(10 * MIB, 64)
    device = 2048 * MIB
    largest = estimate.largest_batch(device)
    usable = device * memory.USABLE_FRACTION
    assert sized(10 * MIB, largest).total <= usable < sized(10 * MIB, largest + 1).total
    assert sized(10 * MIB, largest).fits(device)
    assert not sized(10 * MIB, largest + 1).fits(device)


def test_a_batch_that_cannot_fit_is_refused_with_the_largest_that_fits() -> None:
    estimate = sized(10 * MIB, 256)
    why = memory.refusal(estimate, 2048 * MIB, "GPU 0 (Tesla T4)")
    assert why is not None
    assert "BATCH_SIZE=256 needs about 2.9 GiB" in why
    assert "GPU 0 (Tesla T4) has 2.0 GiB (85% usable)" in why
    assert f"Fix: BATCH_SIZE={estimate.largest_batch(2048 * MIB)} or less" in why
    assert memory.refusal(sized(10 * MIB, 16), 2048 * MIB, "GPU 0") is None


def test_weights_that_do_not_fit_alone_say_so() -> None:
    why = memory.refusal(sized(MIB, 1), 300 * MIB, "GPU 0")
    assert why is not None and "do not fit" in why


def gpu(memory_mib: int) -> GpuInfo:
    return GpuInfo(0, "Tesla T4", "GPU-0", memory_total_mib=Probed(memory_mib))


def keras_model(name: str) -> Any:
    from mgpu_env.bench.models import SHAPES, build_model

    return build_model(name, 1, SHAPES[name])


@pytest.mark.parametrize("name", ["mlp", "resnet"])
def test_weights_and_slots_equal_the_real_variables(logical_cpus: tuple[str, ...], name: str
                                                    ) -> None:
    from mgpu_env.runtime.keras import tensorflow_keras

    model = keras_model(name)
    optimizer = tensorflow_keras().optimizers.Adam()
    optimizer.build(model.trainable_variables)
    estimate = memory.estimate(model, memory.optimizer_slots(optimizer), 32)
    assert estimate.weights == sum(v.numpy().nbytes for v in model.variables)
    assert estimate.gradients == sum(v.numpy().nbytes for v in model.trainable_variables)
    # Adam's slots: m and v per trainable variable; its scalars (iteration, learning
    # rate) are not per-variable state.
    slots = [v for v in optimizer.variables if len(v.shape) > 0]
    assert len(slots) == 2 * len(model.trainable_variables)
    assert estimate.slots == sum(v.numpy().nbytes for v in slots)
    # The gradient the all-reduce moves: the trainable variables' bytes.
    assert allreduce.gradient_bytes(model.trainable_variables) == estimate.gradients


def test_activations_are_every_layers_outputs_at_the_batch(logical_cpus: tuple[str, ...]
                                                           ) -> None:
    model = keras_model("mlp")  # 784 -> 64 -> 64 -> 10, softmax
    per_sample = sum(math.prod(layer.output.shape[1:]) for layer in model.layers)
    assert memory.activation_elements(model) == per_sample
    assert memory.estimate(model, 2, 32).activations == per_sample * 4 * 32
    half = memory.estimate(model, 2, 32, "float16")
    assert half.activations == per_sample * 2 * 32
    assert half.compute_copy == half.weights // 2


def test_a_gpu_too_small_refuses_the_run(logical_cpus: tuple[str, ...]) -> None:
    from mgpu_env.runtime.keras import tensorflow_keras

    model = keras_model("resnet")
    optimizer = tensorflow_keras().optimizers.Adam()
    estimate, lines = _check_devices(model, optimizer, 64, "float32", [gpu(16_384)])
    assert estimate.per_replica_batch == 64 and estimate.fits(16_384 * MIB)
    assert lines[0].startswith("memory per replica: about ")
    assert "GPU 0: " in lines[1] and "largest batch per replica that fits" in lines[1]
    with pytest.raises(ConfigError, match="BATCH_SIZE=4096 needs about"):
        _check_devices(model, optimizer, 4096, "float32", [gpu(1024)])
    assert _check_devices(model, optimizer, 64, "float32", [])[1] == lines[:1]

    class Lion:
        pass

    assumed = _check_devices(model, Lion(), 64, "float32", [])[1][0]
    assert assumed.endswith("at batch 64, Lion's slots taken as Adam's)")


def test_a_loss_scale_optimizer_keeps_its_inner_optimizers_slots() -> None:
    class Adam:
        pass

    class LossScaleOptimizer:
        inner_optimizer = Adam()

    assert memory.optimizer_slots(LossScaleOptimizer()) == 2


def test_a_subclassed_models_unknown_activations_are_said(logical_cpus: tuple[str, ...]
                                                          ) -> None:
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()

    class Subclassed(keras.Model):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(10)

        def call(self, x: Any) -> Any:
            return self.dense(x)

    import numpy as np

    model = Subclassed()
    model(np.zeros((1, 784), dtype=np.float32))  # its weights made; no symbolic outputs
    estimate, lines = _check_devices(model, keras.optimizers.Adam(), 64, "float32", [])
    assert estimate.weights == 7850 * 4 and estimate.activations == 0
    assert lines[0].endswith("activations unknown: the model's layers have no outputs before "
                             "it runs)")


def test_an_optimizer_with_no_known_slots_is_named() -> None:
    class Lion:
        pass

    with pytest.raises(ValueError, match="no slot count for optimizer Lion"):
        memory.optimizer_slots(Lion())


@pytest.mark.slow
def test_resnet50_is_keras_own(logical_cpus: tuple[str, ...]) -> None:
    model = keras_model("resnet50")
    assert model.count_params() == 25_636_712  # Keras' ResNet-50, 1000 classes
    assert tuple(model.input_shape[1:]) == (224, 224, 3)
    assert model.layers[-1].dtype_policy.compute_dtype == "float32"  # softmax in float32
