"""The step's split from TensorFlow's profiler, and the bottleneck named from it.

The converter's JSON in tests/fixtures/profile/ is the real output of xprof's converter for
real traces: 6 steps of an MLP, one `tf.function` call each (mlp_steps.json), and the same
steps run in a `tf.range` loop, where the profiler finds none (while_loop_no_steps.json)."""

from __future__ import annotations

import pytest

from mgpu_env.profile import verdict
from mgpu_env.profile.split import (
    CATEGORY_KEYS,
    SUM_TOLERANCE_MS,
    NoSteps,
    StepSplit,
    split_from_tool_json,
)
from tests.support.children import REPO

FIXTURES = REPO / "tests" / "fixtures" / "profile"


def test_the_converters_steps_are_read_and_their_categories_sum_to_the_step() -> None:
    split = split_from_tool_json((FIXTURES / "mlp_steps.json").read_bytes())
    # Six steps traced; the converter drops the first and the last as incomplete.
    assert split.steps == 4
    assert split.hardware == "CPU_ONLY"
    for step in split.per_step:
        assert abs(step["step_ms"] - sum(step[key] for key in CATEGORY_KEYS)) <= SUM_TOLERANCE_MS
    assert abs(split.unaccounted_ms) <= SUM_TOLERANCE_MS
    # On CPU devices every op is host compute; the device categories stay empty.
    assert split.share("host_compute") > 0.5
    assert split.ms["device_compute"] == split.ms["collectives"] == 0.0


def test_a_trace_with_no_step_says_the_converters_own_reason() -> None:
    with pytest.raises(NoSteps, match="No step time measured"):
        split_from_tool_json((FIXTURES / "while_loop_no_steps.json").read_bytes())


def test_the_middle_steps_leave_out_the_traces_edges() -> None:
    split = split_from_tool_json((FIXTURES / "mlp_steps.json").read_bytes())
    middle = split.middle(2)
    assert middle.per_step == split.per_step[1:3]
    assert middle.step_ms == pytest.approx(sum(s["step_ms"] for s in split.per_step[1:3]) / 2)
    assert split.middle(4) == split.middle(9) == split


def test_a_split_survives_bench_json() -> None:
    split = split_from_tool_json((FIXTURES / "mlp_steps.json").read_bytes())
    assert StepSplit.from_dict(split.as_dict()) == split


def split_of(step_ms: float, **ms: float) -> StepSplit:
    """A split whose named categories hold `ms`, the rest of the step host compute."""
    values = dict.fromkeys(CATEGORY_KEYS, 0.0) | ms
    values["host_compute"] = step_ms - sum(v for k, v in values.items() if k != "host_compute")
    return StepSplit(step_ms, values, 10, "GPU")


# (split, device type, predicted all-reduce seconds) -> the bottleneck: every verdict, each
# side of each threshold.
CASES = [
    (split_of(10.0, input=2.0), "GPU", None, "input-bound"),
    (split_of(10.0, input=1.9, device_compute=8.0), "GPU", None, "compute-bound"),
    (split_of(10.0, collectives=1.5, device_to_device=0.5), "GPU", None, "all-reduce-bound"),
    (split_of(10.0, collectives=1.9, device_compute=8.0), "GPU", None, "compute-bound"),
    # CPU devices: the profiler sees no collectives; the prediction stands in.
    (split_of(10.0), "CPU", 0.002, "all-reduce-bound"),
    (split_of(10.0), "CPU", 0.0019, "compute-bound"),
    (split_of(10.0, collectives=5.0), "CPU", None, "compute-bound"),
    (split_of(10.0, kernel_launch=3.0, other=2.0), "GPU", None, "overhead-bound"),
    (split_of(10.0, kernel_launch=2.9, other=2.0), "GPU", None, "compute-bound"),
    (split_of(1.9), "CPU", None, "overhead-bound"),
    (split_of(10.0), "CPU", None, "compute-bound"),
    (split_of(2.0), "CPU", None, "compute-bound"),
    # Input is tested first: a step waiting for input is input-bound whatever else.
    (split_of(0.5, input=0.4), "CPU", None, "input-bound"),
]


@pytest.mark.parametrize(("call_ms", "expected"), [(5.0, "overhead-bound"),
                                                   (4.9, "compute-bound")])
def test_a_step_little_longer_than_an_empty_call_is_overhead_bound(call_ms: float,
                                                                   expected: str) -> None:
    assert verdict.judge(split_of(10.0), "CPU", call_ms=call_ms).bottleneck == expected


def test_one_interrupted_step_moves_no_verdict() -> None:
    steps = [{**dict.fromkeys(CATEGORY_KEYS, 0.0), "host_compute": ms, "step_ms": ms}
             for ms in (0.5, 0.4, 9.0, 0.4, 0.5)]  # the machine's other work hit step 3
    split = StepSplit(2.16, {**dict.fromkeys(CATEGORY_KEYS, 0.0), "host_compute": 2.16}, 5,
                      "CPU_ONLY", steps)
    assert split.typical_step_ms == 0.5
    assert verdict.judge(split, "CPU").bottleneck == "overhead-bound"


@pytest.mark.parametrize(("split", "device_type", "predicted", "expected"), CASES)
def test_the_bottleneck_is_named_with_its_fixes(
    split: StepSplit, device_type: str, predicted: float | None, expected: str
) -> None:
    found = verdict.judge(split, device_type, predicted)
    assert found.bottleneck == expected
    assert found.fixes == verdict.FIXES[expected]
    assert found.why


def test_the_fixes_name_the_settings_that_help() -> None:
    assert "KEEP_DATA" in " ".join(verdict.FIXES["input-bound"])
    assert "BATCH_SIZE" in " ".join(verdict.FIXES["all-reduce-bound"])
    assert "steps_per_execution" in " ".join(verdict.FIXES["overhead-bound"])
    assert "XLA=1" in " ".join(verdict.FIXES["overhead-bound"])


@pytest.mark.parametrize(("efficiency", "place"), [(0.84, "below"), (0.92, "within"),
                                                   (0.96, "within"), (0.99, "above")])
def test_efficiency_is_placed_against_nvidias_resnet50_runs(efficiency: float, place: str
                                                            ) -> None:
    line = verdict.against_reference(efficiency, 8)
    assert f"{place} the reference's 92-96%" in line
    assert "7.3-7.7x" in line


def test_overlapping_waits_count_once() -> None:
    from mgpu_env.profile.wait import merged_ms

    # Two replicas' get-next at once (0-4 ms and 2-6 ms), one alone later (10-11 ms).
    ms = 10**9
    assert merged_ms([(2 * ms, 6 * ms), (0, 4 * ms), (10 * ms, 11 * ms)]) == pytest.approx(7.0)
    assert merged_ms([(0, 4 * ms), (1 * ms, 2 * ms)]) == pytest.approx(4.0)  # nested
    assert merged_ms([]) == 0.0


@pytest.mark.parametrize(("name", "waits"), [
    ("IteratorGetNextAsOptionalOp::DoCompute", True),
    ("while/body/_1/IteratorGetNext:IteratorGetNext", True),
    ("MultiDeviceIteratorGetNextFromShard", True),
    ("Iterator::Root::Prefetch", False),  # the pipeline's own work, on its threads
    ("GetNextFromShard0", False),
    ("while/body/_1/seed_mlp/dense/MatMul:_MklMatMul", False),
])
def test_the_iterators_get_next_ops_are_the_wait(name: str, waits: bool) -> None:
    from mgpu_env.profile.wait import is_wait_event

    assert is_wait_event(name) is waits


@pytest.mark.parametrize(("line", "pipeline"), [
    ("tf_data_iterator_resource/4191565889548136635", True),  # the prefetch's producer
    ("tf_data_private_threadpool/7589316716723203891", True),  # a pipeline's own pool
    ("tf_data_iterator_get_next_as_optional/-5133077273484495740", False),  # the consumer
    ("tf_data_multi_device_iterator_get_next/2216204619382854710", False),
    ("tf_Compute/1012495205135179070", False),  # the step's executor
    ("python", False),
])
def test_the_pipeline_is_tf_datas_producer_threads(line: str, pipeline: bool) -> None:
    from mgpu_env.profile.wait import is_pipeline_thread

    assert is_pipeline_thread(line) is pipeline


def test_the_pipelines_core_time_sums_its_threads_and_counts_nested_events_once() -> None:
    from types import SimpleNamespace

    from mgpu_env.profile.wait import InputWait, pipeline_ms

    ms = 10**9

    def line(name: str, *spans: tuple[int, int]) -> SimpleNamespace:
        return SimpleNamespace(name=name, events=[
            SimpleNamespace(offset_ps=a * ms, duration_ps=(b - a) * ms) for a, b in spans])

    xspace = SimpleNamespace(planes=[SimpleNamespace(lines=[
        # 0-10 ms with a nested 2-4 ms event, then 20-25: 15 ms of this thread.
        line("tf_data_iterator_resource/1", (0, 10), (2, 4), (20, 25)),
        line("tf_data_private_threadpool/2", (0, 10)),  # at the same time, another core
        line("tf_data_iterator_get_next_as_optional/3", (0, 100)),  # the wait's side
        line("tf_Compute/4", (0, 100)),
    ])])
    assert pipeline_ms(xspace) == pytest.approx(25.0)
    # 25 ms of two cores' 100 ms interval; the wait counts where the step is not on them.
    reading = InputWait(wait_ms=10.0, wall_ms=100.0, events=2, pipeline_ms=25.0, cores=2)
    assert reading.pipeline_share == pytest.approx(0.125)
    assert reading.cost_share(step_on_host=True) == pytest.approx(0.225)
    assert reading.cost_share(step_on_host=False) == pytest.approx(0.1)
