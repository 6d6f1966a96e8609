"""The TensorFlow parts, in this process, on the CPU split into logical devices.

One TensorFlow runtime serves the whole test session (its devices are fixed once it
starts): the `logical_cpus` fixture splits the CPU into four, the way `VIRTUAL_DEVICES=4`
does, and every test here mirrors over some of them. Real MirroredStrategy collectives run;
no subprocess, so these stay in the fast tier.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.hardware.devices import DeviceSplit, apply_split
from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
from mgpu_env.runtime.strategy import WorkerRole, make_strategy, plan_strategy
from mgpu_env.training.shared.position import Position
from tests.support.feeds import rows_seen
from tests.support.runtimes import LOGICAL_CPUS, runtime_of


@pytest.fixture
def float32_policy() -> Iterator[None]:
    import keras

    yield
    keras.mixed_precision.set_global_policy(FLOAT32)


def mirrored(devices: tuple[str, ...], ops: str = "auto") -> Any:
    return make_strategy(plan_strategy(ops, DeviceSplit("CPU", 1, len(devices))))


def test_the_split_gives_tensorflow_that_many_logical_devices(
    logical_cpus: tuple[str, ...],
) -> None:
    import tensorflow as tf

    listed = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert len(listed) == LOGICAL_CPUS and logical_cpus == tuple(
        f"/device:CPU:{i}" for i in range(LOGICAL_CPUS)
    )
    # Applying the same split again (a second run in one process) is a no-op, not an error.
    assert apply_split(DeviceSplit("CPU", 1, LOGICAL_CPUS)) == logical_cpus


@pytest.mark.parametrize(("replicas", "ops"), [(2, "reduction_to_one"),
                                               (4, "hierarchical_copy")])
def test_strategy_from_the_plan_mirrors_over_the_planned_devices(
    logical_cpus: tuple[str, ...], replicas: int, ops: str
) -> None:
    strategy = mirrored(logical_cpus[:replicas], ops)
    assert strategy.num_replicas_in_sync == replicas
    assert len(strategy.extended.worker_devices) == replicas


def _train_a_little(
    strategy: Any, precision: PrecisionChoice, steps_to_run: int = 30
) -> tuple[float, float, Any]:
    import keras
    import tensorflow as tf

    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.loops import iterator_loop
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    keras.mixed_precision.set_global_policy(precision.policy)
    rng = np.random.default_rng(0)
    x = rng.random((512, 784), dtype=np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)  # learnable: the largest of 10 pixels
    global_batch = 32 * strategy.num_replicas_in_sync
    trainer = build_trainer(
        strategy, lambda: build_model(0),
        StepSpec(learning_rate=0.01, precision=precision, global_batch_size=global_batch,
                 jit_compile=False),
    )
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    train_steps = iterator_loop(strategy, trainer.steps.replica_step)
    train_steps(iterator, tf.constant(5))
    first = float(trainer.steps.train_loss.result())
    trainer.steps.reset_train_metrics()
    train_steps(iterator, tf.constant(steps_to_run))
    return first, float(trainer.steps.train_loss.result()), trainer


def test_the_step_trains_on_two_replicas(
    logical_cpus: tuple[str, ...], float32_policy: None
) -> None:
    strategy = mirrored(logical_cpus[:2])
    first, later, trainer = _train_a_little(strategy, PrecisionChoice(FLOAT32, False, "test"))
    assert later < first
    assert int(trainer.optimizer.iterations.numpy()) == 35


def test_fp16_with_loss_scaling_trains_on_two_replicas(
    logical_cpus: tuple[str, ...], float32_policy: None
) -> None:
    strategy = mirrored(logical_cpus[:2])
    first, later, trainer = _train_a_little(
        strategy, PrecisionChoice("mixed_float16", True, "test")
    )
    assert np.isfinite(later) and later < first
    assert trainer.model.layers[1].compute_dtype == "float16"


def test_one_replicas_overflow_makes_every_replica_skip(logical_cpus: tuple[str, ...]) -> None:
    import tensorflow as tf

    from mgpu_env.training.step.steps import _agree_on_finite

    strategy = mirrored(logical_cpus[:2])

    @tf.function
    def run() -> Any:
        def replica() -> Any:
            replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
            bad = tf.where(replica_id == 1, float("inf"), 1.0)
            return _agree_on_finite([tf.fill([3], bad), tf.ones([2])])

        return strategy.run(replica)

    results = run()
    for gradient in results:
        for local in strategy.experimental_local_results(gradient):
            # Every replica's every gradient is non-finite: the step is skipped everywhere.
            assert not np.isfinite(local.numpy()).any()


def test_broadcast_from_chief_gives_every_replica_the_chiefs_values(
    logical_cpus: tuple[str, ...],
) -> None:
    import tensorflow as tf

    from mgpu_env.training.multiworker import broadcast_from_chief

    strategy = mirrored(logical_cpus[:2])
    with strategy.scope():
        weights = tf.Variable([1.5, -2.0])
        step = tf.Variable(7, dtype=tf.int64)
    broadcast_from_chief(strategy, [weights, step], is_chief=True)
    assert weights.numpy().tolist() == [1.5, -2.0] and int(step.numpy()) == 7
    # A process that is not the chief contributes zeros: it takes the chief's (here none).
    broadcast_from_chief(strategy, [weights, step], is_chief=False)
    assert weights.numpy().tolist() == [0.0, 0.0] and int(step.numpy()) == 0


def test_agreement_passes_when_every_replica_has_the_same_settings(
    logical_cpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.multiworker import check_agreement

    # It passes because the values went through the all-gather and were found equal, not
    # because nothing was compared: the comparison it makes is recorded and checked.
    module = sys.modules[check_agreement.__module__]
    compare, compared = module.find_disagreements, []

    def recorded(keys: Any, rows: Any, names: Any) -> list[str]:
        compared.append((keys, rows, names, compare(keys, rows, names)))
        return compared[-1][-1]

    monkeypatch.setattr(module, "find_disagreements", recorded)
    values = {"batch": "64", "precision": "float32"}
    strategy = mirrored(logical_cpus[:2])
    assert check_agreement(strategy, values, WorkerRole()) is None
    ((keys, rows, names, problems),) = compared
    assert problems == [] and names == {0: "chief 0"}
    assert module.decode_values(keys, rows[0]) == values


def test_a_whole_run_in_process_on_four_replicas(
    logical_cpus: tuple[str, ...], tmp_path: Path, float32_policy: None
) -> None:
    from mgpu_env.training.run.plan import plan_training
    from mgpu_env.training.run.trainer import run_plan

    resolved = resolve_settings(
        {"GPUS": "none", "VIRTUAL_DEVICES": str(LOGICAL_CPUS), "DATASET": "digits",
         "EPOCHS": "2", "BATCH_SIZE": "16", "OUTPUT_DIR": str(tmp_path / "run")}, {},
    )
    runtime = runtime_of(resolved)
    assert runtime.strategy_plan.devices == logical_cpus
    plan = plan_training(runtime)
    assert (plan.replicas, plan.global_batch_size) == (4, 64)
    result = run_plan(plan)
    assert result.metrics["replicas"] == 4 and result.metrics["epochs_completed"] == 2
    assert [e["epoch"] for e in result.metrics["history"]] == [1, 2]
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert (tmp_path / "run" / "logs").is_dir()


def _losses_per_call(
    strategy: Any, feed_kind: str, calls: int = 3, steps_per_call: int | None = None,
    stream_call: int = 5,
) -> list[float]:
    """Train the seed's MLP a few calls of 5 steps from a feed; the mean loss of each call."""
    import tensorflow as tf

    from mgpu_env.training.input.data import Arrays
    from mgpu_env.training.input.feeds import ResidentFeed, RowStreamFeed, StreamFeed
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    rng = np.random.default_rng(0)
    x = rng.random((700, 784), dtype=np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)
    arrays = Arrays("test", x, y, x[:10], y[:10])
    global_batch = 64  # 10 steps per epoch; 60 rows of each epoch are left out
    per_epoch = len(x) // global_batch  # the plan's count: whole global batches
    trainer = build_trainer(
        strategy, lambda: build_model(0),
        StepSpec(learning_rate=0.01, precision=PrecisionChoice(FLOAT32, False, "test"),
                 global_batch_size=global_batch, jit_compile=False),
    )
    feed: Any = (
        ResidentFeed.place(strategy, arrays, global_batch, seed=3, steps_per_epoch=per_epoch)
        if feed_kind == "resident"
        else StreamFeed(strategy, arrays, global_batch, seed=3, steps_per_call=stream_call,
                        steps_per_epoch=per_epoch)
        if feed_kind == "stream"
        else RowStreamFeed(strategy, tf.data.Dataset.from_tensor_slices((x, y)), len(x),
                           global_batch, seed=3, steps_per_epoch=per_epoch)
    )
    if steps_per_call is not None:
        assert feed.steps_per_call == steps_per_call
    run = trainer.loops.runner(feed.source(Position(1), epochs=2))  # calls cross the epochs
    losses = []
    for _ in range(calls):
        trainer.steps.reset_train_metrics()
        run(5)
        losses.append(float(trainer.steps.train_loss.result()))
    assert int(trainer.optimizer.iterations.numpy()) == 5 * calls
    return losses


@pytest.mark.parametrize("feed_kind", ["resident", "stream", "rows"])
def test_every_replica_count_trains_on_the_same_global_batches(
    logical_cpus: tuple[str, ...], float32_policy: None, feed_kind: str
) -> None:
    # The batches themselves: the rows of each of an epoch's 15 global batches, to the row.
    def batches(replicas: int) -> list[np.ndarray]:
        return rows_seen(mirrored(logical_cpus[:replicas]), feed_kind, 250, 16,
                         [(step, 1) for step in range(15)])

    one_rows = batches(1)
    assert all(rows.sum() == 16 for rows in one_rows)
    for replicas in (2, 4):
        for step, (many, one) in enumerate(zip(batches(replicas), one_rows, strict=True)):
            np.testing.assert_array_equal(many, one, err_msg=f"global batch {step}")
    # And the training on them: only the order of the sums differs between replica counts.
    # Another order moves these losses by 4-16% (seed 3 against 4); rounding alone stays far
    # below 1e-3, though not always below 1e-5: Adam's m/(sqrt(v)+eps) can turn a last-bit
    # difference in a near-zero gradient into a visible step (2.5e-4 was seen once, in CI on
    # a loaded machine; the batches, checked above, are what tells a wrong row).
    one = _losses_per_call(mirrored(logical_cpus[:1]), feed_kind)
    for replicas in (2, 4):
        many = _losses_per_call(mirrored(logical_cpus[:replicas]), feed_kind)
        np.testing.assert_allclose(many, one, rtol=1e-3, err_msg=f"{replicas} replicas")


def test_a_resident_feed_splits_calls_to_bound_the_rows_it_gathers(
    logical_cpus: tuple[str, ...], float32_policy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.input.feeds import resident

    whole = _losses_per_call(mirrored(logical_cpus[:2]), "resident")
    # Room for two steps' rows per call (32 rows of 784 float32 + an int32 label per replica).
    monkeypatch.setattr(resident, "CALL_ROWS_BYTES", 2 * 32 * (784 * 4 + 4) + 1)
    split = _losses_per_call(mirrored(logical_cpus[:2]), "resident", steps_per_call=2)
    # Calls of 2, 2 and 1 steps run the same steps on the same rows: the same bits.
    assert split == whole


def test_streamed_and_kept_rows_train_on_the_same_batches(
    logical_cpus: tuple[str, ...], float32_policy: None
) -> None:
    # Data over the device limit streams from the host: its run must not differ from one
    # whose data fits, so both follow one epoch order.
    for replicas in (1, 2):
        kept = _losses_per_call(mirrored(logical_cpus[:replicas]), "resident")
        streamed = _losses_per_call(mirrored(logical_cpus[:replicas]), "stream")
        np.testing.assert_allclose(streamed, kept, rtol=1e-6)


def test_a_stream_of_short_chunks_trains_on_the_kept_rows_batches(
    logical_cpus: tuple[str, ...], float32_policy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.input.feeds import arrays_stream as stream

    kept = _losses_per_call(mirrored(logical_cpus[:2]), "resident")
    # Chunks of 7 steps (32 rows of 784 float32 + an int32 label per replica, and a caller
    # said to ask for 7 at a time): calls of 5 steps cross chunks, and the third call reaches
    # the run's last chunk, of 6 steps.
    monkeypatch.setattr(stream, "STREAM_CHUNK_BYTES", 7 * 32 * (784 * 4 + 4) + 1)
    streamed = _losses_per_call(mirrored(logical_cpus[:2]), "stream", stream_call=7)
    np.testing.assert_allclose(streamed, kept, rtol=1e-6)


def test_calls_of_whole_chunks_take_them_from_the_stream_in_one_call(
    logical_cpus: tuple[str, ...], float32_policy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.input.feeds import arrays_stream as stream
    from mgpu_env.training.step import loops

    class Counted:
        """The trainer's compiled loops of chunks, counting the calls a runner makes of each."""

        def __init__(self, loops: Any) -> None:
            self.loops, self.calls = loops, {"train_chunk": 0, "train_chunks": 0}

        def __getattr__(self, name: str) -> Any:
            function = getattr(self.loops, name)
            if name not in self.calls:
                return function

            def counted(*args: Any) -> Any:
                self.calls[name] += 1
                return function(*args)

            return counted

    counted: list[Counted] = []
    chunk_loops = loops.chunk_loops

    def count_loops(*args: Any) -> Counted:
        counted.append(Counted(chunk_loops(*args)))
        return counted[-1]

    kept = _losses_per_call(mirrored(logical_cpus[:2]), "resident")
    # Room for 7 steps, calls of 5: chunks of 5 (the largest divisor of 5 that fits).
    monkeypatch.setattr(stream, "STREAM_CHUNK_BYTES", 7 * 32 * (784 * 4 + 4) + 1)
    monkeypatch.setattr(loops, "chunk_loops", count_loops)
    streamed = _losses_per_call(mirrored(logical_cpus[:2]), "stream", stream_call=5)
    np.testing.assert_allclose(streamed, kept, rtol=1e-6)
    assert counted[0].calls == {"train_chunk": 0, "train_chunks": 3}


def test_a_new_feed_needs_only_the_replica_step(
    logical_cpus: tuple[str, ...], float32_policy: None
) -> None:
    """A feed written here, touching no other feed, no step and no loop: it only says where
    its rows are (a source), the trainer's loop runs the real replica step over them, and
    it trains as the kept rows do on the same batches."""
    import dataclasses

    import tensorflow as tf

    from mgpu_env.training.input.data import Arrays
    from mgpu_env.training.input.feeds import Feed, ResidentFeed
    from mgpu_env.training.input.order import epoch_order
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.loops import Batches
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepFunctions, StepSpec

    # The steps offer one replica step and one evaluation: no entry per feed.
    assert [f.name for f in dataclasses.fields(StepFunctions)] == [
        "replica_step", "evaluate", "weights_finite",
        "train_loss", "train_accuracy", "test_loss", "test_accuracy",
    ]

    class HostFeed:
        """A data set of one global batch: each epoch (one step) its rows in the epoch's
        order, taken from the host by tf.data, half to each replica."""

        def __init__(self, strategy: Any, x: np.ndarray, y: np.ndarray) -> None:
            self.strategy, self.x, self.y, self.global_batch = strategy, x, y, len(x)

        @property
        def steps_per_epoch(self) -> int:
            return 1

        def describe(self) -> str:
            return "one global batch, ordered on the host each epoch"

        def source(self, start: Position, epochs: int = 1) -> Batches:
            rows = np.concatenate([epoch_order(3, epoch, len(self.x), self.global_batch)
                                   for epoch in range(start.epoch, start.epoch + epochs)])
            data = tf.data.Dataset.from_tensor_slices((self.x[rows], self.y[rows]))
            return Batches(self.strategy.experimental_distribute_dataset(
                data.batch(self.global_batch)))

    rng = np.random.default_rng(0)
    x = rng.random((64, 784), dtype=np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)
    strategy = mirrored(logical_cpus[:2])

    def trained(make_feed: Callable[[], Any]) -> tuple[list[Any], list[Any]]:
        trainer = build_trainer(
            strategy, lambda: build_model(0),
            StepSpec(learning_rate=0.01, precision=PrecisionChoice(FLOAT32, False, "test"),
                     global_batch_size=64, jit_compile=False),
        )
        before = [w.numpy() for w in trainer.model.trainable_variables]
        feed = make_feed()
        assert isinstance(feed, Feed)
        trainer.loops.runner(feed.source(Position(0), 6))(6)
        assert int(trainer.optimizer.iterations.numpy()) == 6
        return before, [w.numpy() for w in trainer.model.trainable_variables]

    before, new = trained(lambda: HostFeed(strategy, x, y))
    assert not all(np.array_equal(b, a) for b, a in zip(before, new, strict=True))
    _, kept = trained(lambda: ResidentFeed.place(strategy, Arrays("test", x, y, x, y), 64, 3,
                                                  steps_per_epoch=len(x) // 64))
    for weights, reference in zip(new, kept, strict=True):
        np.testing.assert_array_equal(weights, reference)


def test_each_feed_says_what_it_is(logical_cpus: tuple[str, ...]) -> None:
    import tensorflow as tf

    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.training.input.data import Arrays
    from mgpu_env.training.input.feeds import ResidentFeed, RowStreamFeed, StreamFeed

    x = np.zeros((100, 784), np.float32)
    arrays = Arrays("test", x, np.zeros(100, np.int32), x[:1], np.zeros(1, np.int32))
    two, one = mirrored(logical_cpus[:2]), mirrored(logical_cpus[:1])
    assert (ResidentFeed.place(two, arrays, 8, 1, steps_per_epoch=12).describe()
            == "rows kept on each of 2 devices, gathered by index")
    assert (StreamFeed(one, arrays, 8, 1, steps_per_call=5, steps_per_epoch=12).describe()
            == "rows in host memory, streamed to the device by tf.data in chunks of 5 steps")
    rows = tf.data.Dataset.from_tensor_slices((x, arrays.y_train))
    assert RowStreamFeed(two, rows, 100, 8, 1, steps_per_epoch=12).describe() == (
        "a loader's rows, streamed from its pipeline to each of 2 devices by tf.data, "
        "shuffled among 10,000")
    assert (SameBatchFeed.make(two, 4, (784,), 10, 1).describe()
            == "one synthetic batch on each of 2 devices, reused every step")


def test_chunks_divide_the_callers_calls_where_that_costs_little() -> None:
    from mgpu_env.training.input.feeds.arrays_stream import aligned_chunk

    assert aligned_chunk(83, 200) == 50  # training's calls of 200, the MLP's 16 MiB chunks
    assert aligned_chunk(83, 50) == 50  # mgpu bench's intervals of 50
    assert aligned_chunk(7, 5) == 5
    assert aligned_chunk(100, 199) == 100  # 199 is prime: one-step chunks would cost more
    assert aligned_chunk(1, 200) == 1  # a step's rows over the budget: one step a chunk


def test_each_worker_streams_its_own_replicas_batches(logical_cpus: tuple[str, ...]) -> None:
    from mgpu_env.training.input.data import Arrays
    from mgpu_env.training.input.feeds import StreamFeed
    from mgpu_env.training.input.order import epoch_order

    x = np.zeros((100, 784), np.float32)
    arrays = Arrays("test", x, np.zeros(100, np.int32), x[:1], np.zeros(1, np.int32))
    # 4 replicas in sync as 2 workers of 2: global batch 8, 2 rows per replica batch.
    feed = StreamFeed(mirrored(logical_cpus[:4]), arrays, global_batch=8, seed=1,
                      steps_per_epoch=100 // 8)
    order = epoch_order(1, 0, 100, 8).reshape(-1, 2)  # 48 replica batches, 12 steps
    first, second = (feed.worker_batches(Position(0), 1, workers=2, worker=w) for w in (0, 1))
    # Step s: replicas 0 and 1 (worker 0) take batches 4s and 4s+1, worker 1 4s+2 and 4s+3.
    np.testing.assert_array_equal(first, order.reshape(12, 4, 2)[:, :2].reshape(-1, 2))
    np.testing.assert_array_equal(second, order.reshape(12, 4, 2)[:, 2:].reshape(-1, 2))
    np.testing.assert_array_equal(feed.worker_batches(Position(0), 1, workers=1, worker=0), order)
    # Each worker's chunks: its replicas' batches of the same steps, one replica after the other.
    chunks = feed.worker_chunks(Position(0), 1, workers=2, worker=1)
    assert len(chunks) == 2 and all(c.shape == (12, 2) for c in chunks)
    np.testing.assert_array_equal(chunks[1], order.reshape(12, 4, 2)[:, 3])


STREAMING_LOADER = """
import numpy as np
import tensorflow as tf

def load():
    rng = np.random.default_rng(0)
    x = rng.random((900, 8, 8, 1), dtype=np.float32)
    y = (x.reshape(900, -1)[:, :3].argmax(axis=1)).astype(np.int64)
    rows = tf.data.Dataset.from_tensor_slices((x, y))
    # filter: a size tf.data does not know, as for a pipeline over files
    return rows.take(700).filter(lambda x, y: True), rows.skip(700)
"""


@pytest.fixture
def streaming_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logical_cpus: tuple[str, ...]
) -> str:
    """A loader of tf.data.Datasets over the (lowered) read limit: they stream."""
    from mgpu_env.training.input.data import loader

    (tmp_path / "big_rows.py").write_text(STREAMING_LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(loader, "READ_LIMIT_BYTES", 100 * (8 * 8 * 4 + 4))
    yield "big_rows:load"
    sys.modules.pop("big_rows", None)


def test_a_loaders_stream_over_the_read_limit_is_not_read_into_memory(
    streaming_loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.input.data import Arrays, Streamed, load_data, loader, resolve_dataset

    data = load_data(resolve_dataset(streaming_loader, None, {}), seed=0)
    assert isinstance(data, Streamed)
    # One counting pass found what the plan needs: sizes, sample shape, classes.
    assert (data.train_size, data.test_size) == (700, 200)
    assert (data.sample_shape, data.num_classes) == ((8, 8, 1), 3)
    monkeypatch.setattr(loader, "READ_LIMIT_BYTES", 2 * 1024**3)
    assert isinstance(load_data(resolve_dataset(streaming_loader, None, {}), seed=0), Arrays)


def test_a_whole_run_streams_a_loaders_rows_and_evaluates_them_all(
    streaming_loader: str, tmp_path: Path, float32_policy: None
) -> None:
    from mgpu_env.training.run.plan import plan_training
    from mgpu_env.training.run.prepare import PreparedRun
    from mgpu_env.training.run.progress import Progress
    from mgpu_env.training.run.trainer import run_plan

    # The whole test: its global batch on 1, 2 and 4 replicas is
    # test_every_replica_count_trains_on_the_same_global_batches["rows"].
    resolved = resolve_settings(
        {"GPUS": "none", "VIRTUAL_DEVICES": str(LOGICAL_CPUS), "DATASET": streaming_loader,
         "EPOCHS": "2", "BATCH_SIZE": "16", "OUTPUT_DIR": str(tmp_path / "run")}, {},
    )
    shown: list[PreparedRun] = []

    def show(prepared: PreparedRun) -> Progress:
        shown.append(prepared)
        return Progress()

    metrics = run_plan(plan_training(runtime_of(resolved)), show).metrics
    plan = shown[0].data_plan
    assert (plan.train_size, plan.test_size, plan.steps_per_epoch) == (700, 200, 10)
    assert plan.input_shape == (8, 8, 1) and plan.num_classes == 3
    assert plan.feed.kind == "row_stream"
    assert metrics["epochs_completed"] == 2 and metrics["test_samples"] == 200
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    assert (tmp_path / "run" / "model.keras").is_file()


def test_bench_streams_a_loaders_rows_on_its_real_and_stream_points(
    streaming_loader: str, logical_cpus: tuple[str, ...]
) -> None:
    from mgpu_env.bench.sweep import plan_devices, plan_points
    from mgpu_env.bench.worker import point_data, real_feed
    from mgpu_env.training.input.feeds import RowStreamFeed

    settings = resolve_settings({"GPUS": "none", "DATASET": streaming_loader,
                                 "BENCH_DATA": "all"}, {}).settings
    runtime = runtime_of(settings)
    specs = plan_points(settings, plan_devices(settings, runtime.selection, {}),
                        runtime.precision)
    for spec in specs:
        data = point_data(spec)
        assert data.shape.input_shape == (8, 8, 1) and data.shape.classes == 3
        if spec.data != "synthetic":
            feed, source = real_feed(spec, mirrored(logical_cpus[:1]), data)
            assert isinstance(feed, RowStreamFeed) and feed.steps_per_epoch == 700 // 64
            assert source.endswith("streamed from its pipeline by tf.data")


def test_the_epoch_order_is_a_seeded_permutation_cut_to_whole_batches() -> None:
    from mgpu_env.training.input.order import epoch_order

    order = epoch_order(seed=5, epoch=2, size=1000, global_batch=64)
    assert order.shape == (960,) and len(set(order.tolist())) == 960
    assert set(order.tolist()) <= set(range(1000))
    assert np.array_equal(order, epoch_order(5, 2, 1000, 64))
    assert not np.array_equal(order, epoch_order(5, 3, 1000, 64))
    assert not np.array_equal(order, epoch_order(6, 2, 1000, 64))
    # The partial batch dropped is a different one each epoch.
    left_out = [set(range(1000)) - set(epoch_order(5, e, 1000, 64).tolist()) for e in (0, 1)]
    assert left_out[0] != left_out[1]
