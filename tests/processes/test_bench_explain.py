"""`mgpu bench --explain` and `mgpu train --profile`: real traces of TensorFlow's profiler on
logical CPU devices, split by xprof's converter. The numbers mean nothing on a shared CPU;
what is tested is that the split adds up, that a slow input and a tiny step are named as
such, that the prediction uses the model's real gradient, and that the trace is one the
profile plugin reads."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.bench.explain import explain_points
from mgpu_env.profile.split import CATEGORY_KEYS, SUM_TOLERANCE_SHARE
from tests.support import train_process
from tests.support.children import REPO

PROFILED_STEPS = 4
FIXTURES = REPO / "tests" / "fixtures" / "profile"


def explaining_runner(busbw_gbps: float) -> Any:
    """The canned bench child (`tests.support.bench.fake_runner`) with each point's
    `explain` as a child reports it: the split of a real trace (xprof's converter output
    in tests/fixtures), the MLP's gradient and a flat busbw sweep."""
    from mgpu_env.profile.split import split_from_tool_json
    from tests.support.bench import fake_runner

    canned = fake_runner()
    split = split_from_tool_json((FIXTURES / "mlp_steps.json").read_bytes()).as_dict()

    def run(group: Any, timeout_s: float | None = None) -> list[dict[str, Any]]:
        results = canned(group)
        for spec, result in zip(group, results, strict=True):
            result["explain"] = {
                "split": split, "gradient_bytes": 55_050 * 4, "call_ms": 0.3,
                "unprofiled_step_ms": 40.0, "profiled_input": "none",
                "profile_dir": spec.profile_dir,
                "busbw_sweep": [[1 << 20, busbw_gbps]] if spec.replicas > 1 else [],
                "memory_estimate": {"total": 3 << 20}, "peak_memory_bytes": {"GPU:0": 5 << 20},
            }
        return results

    return run


@pytest.mark.parametrize(("busbw_gbps", "at_two"), [(100.0, "compute-bound"),
                                                     (0.05, "all-reduce-bound")])
def test_the_report_names_each_points_bottleneck(tmp_path: Path, busbw_gbps: float,
                                                 at_two: str) -> None:
    from entrypoint.bench import explain_lines, render_explain
    from mgpu_env.bench.plot import draw_bench
    from mgpu_env.bench.sweep import run_bench
    from tests.support.bench import settings
    from tests.support.runtimes import runtime_of

    runtime = runtime_of(settings(VIRTUAL_DEVICES="2", BENCH_EXPLAIN="1"))
    data = run_bench(runtime, environ={}, runner=explaining_runner(busbw_gbps),
                     profile_root=tmp_path).as_dict()
    one, two = data["points"]
    assert one["explain"]["verdict"]["bottleneck"] == "compute-bound"
    assert one["explain"]["allreduce"]["seconds"] == 0.0
    assert two["explain"]["verdict"]["bottleneck"] == at_two
    # 2(n-1)/n x bytes / busbw at n = 2: the gradient's bytes over the bus bandwidth.
    assert two["explain"]["allreduce"]["seconds"] == pytest.approx(
        55_050 * 4 / (busbw_gbps * 1e9))
    assert two["explain"]["efficiency_lost"] == pytest.approx(1 - two["efficiency"])
    assert "reference's 92-96%" in two["explain"]["reference"]
    assert Path(two["explain"]["profile_dir"]) == tmp_path / "2x-fp32"
    # The canned one-call step took 40 ms unprofiled; the timed loop's step is shorter.
    assert two["explain"]["call_share"] == pytest.approx(
        1 - two["step_time_ms"]["median"] / 40.0)
    assert any("of a lone step is its call" in line for line in explain_lines(data))
    assert "  memory per replica: estimated 3 MiB; measured peak GPU:0 5 MiB" in explain_lines(
        data)
    assert render_explain(data).row_count == 2
    lines = [line for line in explain_lines(data) if not line.startswith("  ")]
    assert lines[1].startswith(f"2 replica(s), fp32: {at_two}: ")
    import matplotlib.pyplot as plt

    figure = draw_bench(data)
    assert len(figure.axes) == 3  # throughput, efficiency, the split
    plt.close(figure)


def two_replica_trainer(logical_cpus: tuple[str, ...]) -> tuple[Any, Any]:
    """The packaged trainer (the MLP, Adam, float32) on two logical CPU devices."""
    import tensorflow as tf

    from mgpu_env.bench.models import SHAPES, build_model
    from mgpu_env.runtime.precision import choose_precision
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.steps import StepSpec

    strategy = tf.distribute.MirroredStrategy(
        list(logical_cpus[:2]), cross_device_ops=tf.distribute.ReductionToOneDevice())
    trainer = build_trainer(
        strategy, lambda: build_model("mlp", 1, SHAPES["mlp"]),
        StepSpec(learning_rate=0.001, precision=choose_precision("0", "CPU", (), frozenset()),
                 global_batch_size=128, jit_compile=False),
    )
    return strategy, trainer


class SlowRows:
    """Arrays whose every batch the input pipeline holds back 100 ms (`time.sleep` in a
    `tf.numpy_function`): a deliberately slow input."""

    def __init__(self) -> None:
        import numpy as np

        self.x_train = np.random.default_rng(0).random((1024, 784), dtype=np.float32)
        self.y_train = np.zeros(1024, dtype=np.int32)


@pytest.mark.slow
def test_a_slow_input_is_input_bound_and_the_split_adds_up(
    logical_cpus: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorflow as tf

    from mgpu_env.profile import steps
    from mgpu_env.profile.verdict import judge

    _, trainer = two_replica_trainer(logical_cpus)

    def slow(x: Any) -> Any:
        time.sleep(0.1)
        return x

    real_iterator = steps._iterator

    def slow_iterator(strategy: Any, source: steps.StepSource) -> tuple[Any, str]:
        arrays = source.arrays
        dataset = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train))
        dataset = dataset.repeat().batch(source.global_batch, drop_remainder=True).map(
            lambda x, y: (tf.ensure_shape(tf.numpy_function(slow, [x], tf.float32), x.shape),
                          y))
        return iter(strategy.experimental_distribute_dataset(dataset)), "slow"

    monkeypatch.setattr(steps, "_iterator", slow_iterator)
    result = steps.profile_replica_step(trainer, tmp_path / "slow", PROFILED_STEPS,
                                        steps.StepSource(arrays=SlowRows(), global_batch=128))
    monkeypatch.setattr(steps, "_iterator", real_iterator)
    split = result["split"]
    assert split["steps"] == PROFILED_STEPS, split["per_step"]
    # The categories sum to the profiled step time (tolerance: SUM_TOLERANCE_SHARE).
    assert abs(sum(split["ms"][k] for k in CATEGORY_KEYS) - split["step_ms"]) <= (
        SUM_TOLERANCE_SHARE * split["step_ms"])
    from mgpu_env.profile.split import StepSplit

    assert judge(StepSplit.from_dict(split), "CPU").bottleneck == "input-bound"


def test_a_slow_input_waits_in_the_trace_and_a_ready_one_does_not(
    logical_cpus: tuple[str, ...], tmp_path: Path
) -> None:
    import numpy as np
    import tensorflow as tf

    from mgpu_env.profile.wait import trace_wait

    strategy = two_replica_trainer(logical_cpus)[0]

    def slow(x: Any) -> Any:
        time.sleep(0.05)
        return x

    def loop_over(dataset: Any) -> Any:
        iterator = iter(strategy.experimental_distribute_dataset(dataset))

        @tf.function
        def steps(count: Any) -> Any:
            total = tf.constant(0.0)
            for _ in tf.range(count):  # the loop the training calls run their steps in
                total += strategy.reduce("SUM", strategy.run(tf.reduce_sum, (next(iterator),)),
                                         axis=None)
            return total

        steps(tf.constant(1)).numpy()  # traced outside the profile
        return lambda: steps(tf.constant(6)).numpy()

    rows = tf.data.Dataset.from_tensor_slices(np.ones((64, 4), np.float32)).repeat().batch(8)
    waited = trace_wait(tmp_path / "slow", loop_over(rows.map(
        lambda x: tf.ensure_shape(tf.numpy_function(slow, [x], tf.float32), x.shape))))
    ready = trace_wait(tmp_path / "ready", loop_over(rows.take(1).cache().repeat()
                                                     .prefetch(tf.data.AUTOTUNE)))
    # Six steps of 50 ms of input each: most of the interval is the wait, about 300 ms.
    assert waited.events >= 6 and waited.share > 0.5 and waited.wait_ms >= 250, waited
    # The 50 ms run on tf.data's threads, not the step's: the pipeline's time, on top of
    # the wait; a cached batch takes them none.
    assert waited.pipeline_ms >= 250 and waited.cores >= 1, waited
    assert ready.pipeline_ms < waited.pipeline_ms / 10, (ready, waited)
    assert waited.cost_share(step_on_host=True) == pytest.approx(
        waited.share + waited.pipeline_share)
    assert waited.cost_share(step_on_host=False) == waited.share
    # A batch ready in memory: the get-next's own cost only (the step here is a sum, so
    # that is still a share of it: ms, not the share, tell the two apart).
    assert ready.wait_ms < waited.wait_ms / 10, (ready, waited)


@pytest.mark.slow
def test_a_tiny_step_is_overhead_bound_and_the_plugin_reads_the_trace(
    logical_cpus: tuple[str, ...], tmp_path: Path
) -> None:
    import tensorflow as tf

    from mgpu_env.profile.split import split_from_tool_json
    from mgpu_env.profile.steps import call_cost_ms
    from mgpu_env.profile.trace import trace_steps
    from mgpu_env.profile.verdict import judge

    counter = tf.Variable(0.0)

    @tf.function
    def tiny() -> None:
        counter.assign_add(1.0)

    tiny()
    files = trace_steps(tmp_path, lambda: (tiny(), counter.numpy()), 2 * PROFILED_STEPS)
    assert [f.parent.parent for f in files] == [tmp_path / "plugins" / "profile"]
    # TensorBoard's Profile tab: the plugin lists its tools for the trace, and serves them.
    from xprof.convert import raw_to_tool_data

    tools = raw_to_tool_data.xspace_to_tool_names(files)
    assert {"overview_page", "input_pipeline_analyzer"} <= set(tools)
    assert any(tool.startswith("trace_viewer") for tool in tools)
    data, _ = raw_to_tool_data.xspace_to_tool_data(
        files, "input_pipeline_analyzer", {"use_saved_result": False})
    split = split_from_tool_json(data)
    # The step is little more than its call: overhead-bound, whatever the machine's load.
    call_ms = call_cost_ms(tf.distribute.get_strategy(), 2 * PROFILED_STEPS)
    verdict = judge(split, "CPU", call_ms=call_ms)
    assert verdict.bottleneck == "overhead-bound", (
        call_ms, [step["step_ms"] for step in split.per_step], split.ms)


@pytest.mark.slow
def test_explain_predicts_the_all_reduce_from_the_real_gradient(
    logical_cpus: tuple[str, ...], tmp_path: Path
) -> None:
    from mgpu_env.bench.explain import explain_variant
    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.profile.steps import StepSource

    strategy, trainer = two_replica_trainer(logical_cpus)
    feed = SameBatchFeed.make(strategy, 64, (784,), 10, 1)
    spec = type("Spec", (), {"replicas": 2, "global_batch": 128, "per_replica_batch": 64})()
    explained = explain_variant(spec, trainer, StepSource(feed.batches.batch), tmp_path)
    real_bytes = sum(v.numpy().nbytes for v in trainer.model.trainable_variables)
    assert explained["gradient_bytes"] == real_bytes == 55_050 * 4
    assert [size for size, _ in explained["busbw_sweep"]] == [1 << 20, 16 << 20, 64 << 20]
    point = {"replicas": 2, "efficiency": 0.8, "explain": explained,
             "worker": {"device_type": "CPU"}}
    explain_points([point], None)
    prediction = explained["allreduce"]
    bus = explained["busbw_sweep"][0][1]  # 1 MiB: the size nearest 220 kB
    assert prediction["seconds"] == pytest.approx(real_bytes / (bus * 1e9))
    assert explained["collectives_measured_ms"] is None  # CPU: the profiler cannot see them
    assert explained["verdict"]["bottleneck"] in ("compute-bound", "all-reduce-bound",
                                                  "overhead-bound")
    assert explained["efficiency_lost"] == pytest.approx(0.2)


@pytest.mark.slow
def test_profiled_steps_leave_the_weights_as_they_were(
    logical_cpus: tuple[str, ...], tmp_path: Path
) -> None:
    from mgpu_env.profile.steps import StepSource, profile_replica_step

    _, trainer = two_replica_trainer(logical_cpus)
    before = [v.numpy().copy() for v in [*trainer.model.variables, *trainer.optimizer.variables]]
    result = profile_replica_step(trainer, tmp_path, 2,
                                  StepSource(arrays=SlowRows(), global_batch=128),
                                  keep_weights=True)
    after = [v.numpy() for v in [*trainer.model.variables, *trainer.optimizer.variables]]
    assert "split" in result
    assert all((b == a).all() for b, a in zip(before, after, strict=True))


# ------------------------------------------------------------------- end to end, slow

PROBE = (
    "import sys\nfrom entrypoint.__main__ import main\n"
    "try:\n    main()\nexcept SystemExit as exit:\n    code = exit.code\n"
    "loaded = sorted(m for m in sys.modules if m.startswith(('xprof', 'mgpu_env.profile')))\n"
    "print('LOADED', loaded)\n"
)


@pytest.mark.slow
def test_train_profile_writes_a_trace_and_off_imports_nothing(tmp_path: Path) -> None:
    profiled = tmp_path / "profiled"
    result = train_process.run(profiled, PROFILE="3", EPOCHS="1", QUIET="0")
    assert result.returncode == 0, result.stderr
    assert "profile: 3 steps of " in result.stdout, result.stdout
    assert "profile: in " in result.stdout and "Profile tab" in result.stdout
    assert list((profiled / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))
    plain = tmp_path / "plain"
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, "train"], env=train_process.train_env(plain, EPOCHS="1"),
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "LOADED []" in probe.stdout, probe.stdout + probe.stderr
    assert not (plain / "logs" / "plugins").exists()


@pytest.mark.slow
def test_bench_explain_reports_each_point(tmp_path: Path) -> None:
    env = train_process.train_env(
        tmp_path / "bench", VIRTUAL_DEVICES="2", BENCH_EXPLAIN="1", BENCH_STEPS="5",
        BENCH_INTERVALS="2", BENCH_WARMUP="2", DATASET="synthetic")
    result = subprocess.run([sys.executable, "-m", "entrypoint", "bench"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "where the step's time goes" in result.stdout
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    for point in report["points"]:
        explained = point["explain"]
        assert explained["split"]["steps"] == 10
        assert explained["verdict"]["bottleneck"]
        assert explained["gradient_bytes"] == 55_050 * 4
        assert explained["memory_estimate"]["weights"] == 55_050 * 4
        assert explained["peak_memory_bytes"] == {}  # CPU devices: TensorFlow counts none
        assert Path(explained["profile_dir"]).parent == tmp_path / "bench" / "profile"
