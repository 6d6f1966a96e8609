"""`mgpu bench`: the plan, the report and bench.json, the plot, and the CLI's exit codes.

Children are replaced by a fake runner with known timings, so everything here but the
`slow` test runs without TensorFlow in milliseconds.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from entrypoint.bench import render_costs
from mgpu_env.bench import sweep as bench
from mgpu_env.bench.input_alone import (
    KEPT_REASON,
    MIN_TIMED_ELEMENTS,
    SampleBudget,
    element_samples,
    measure_input_alone,
    time_dataset,
)
from mgpu_env.bench.plot import draw_bench, plot_bench
from mgpu_env.bench.rounds import Schedule, lead_in_steps, round_orders, time_interleaved
from mgpu_env.bench.sweep import (
    Group,
    PointSpec,
    attach_executions,
    comparison_points,
    group_points,
    parse_child_output,
    plan_devices,
    plan_points,
    replica_counts,
    run_bench,
    write_results,
)
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import GpuRequest
from mgpu_env.hardware.devices import GpuSelection
from mgpu_env.hardware.nvml import GpuInfo, Probed
from mgpu_env.runtime.precision import choose_precision
from mgpu_env.training.shared.position import Position
from tests.support.bench import fake_runner, settings
from tests.support.runtimes import runtime_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cpu_selection() -> GpuSelection:
    return GpuSelection(GpuRequest("none"), (), "-1")


def gpu_selection(count: int, capability: tuple[int, int] = (8, 0)) -> GpuSelection:
    gpus = tuple(
        GpuInfo(i, "NVIDIA A100", f"GPU-{i}", compute_capability=Probed(capability))
        for i in range(count)
    )
    return GpuSelection(GpuRequest("all"), gpus, ",".join(str(i) for i in range(count)))


# ---------------------------------------------------------------------------- the plan


def test_cpu_with_virtual_devices_sweeps_logical_devices() -> None:
    devices = plan_devices(settings(VIRTUAL_DEVICES="4"), cpu_selection(), {})
    assert (devices.kind, devices.logical, devices.max_replicas) == ("CPU", True, 4)
    assert devices.child_devices(1) == (0, None)
    assert devices.child_devices(4) == (4, None)
    assert "sharing its cores" in devices.notes[0]
    assert replica_counts(settings(VIRTUAL_DEVICES="4"), devices) == (1, 2, 4)


def test_cpu_alone_runs_one_replica_and_says_how_to_sweep() -> None:
    devices = plan_devices(settings(), cpu_selection(), {})
    assert devices.max_replicas == 1
    assert "VIRTUAL_DEVICES" in devices.notes[0]


def test_gpus_sweep_subsets_of_the_selection() -> None:
    devices = plan_devices(settings(), gpu_selection(3), {})
    assert (devices.kind, devices.logical, devices.max_replicas) == ("GPU", False, 3)
    assert replica_counts(settings(), devices) == (1, 2, 3)
    assert devices.child_devices(2) == (0, "0,1")
    assert devices.child_devices(3) == (0, "0,1,2")


def test_a_preset_cuda_visible_devices_is_respected() -> None:
    selection = GpuSelection(GpuRequest("all"), gpu_selection(2).gpus, None)
    devices = plan_devices(settings(), selection, {"CUDA_VISIBLE_DEVICES": "3,1"})
    assert devices.child_devices(1) == (0, "3")
    assert devices.child_devices(2) == (0, "3,1")


def test_one_gpu_split_into_logical_devices() -> None:
    devices = plan_devices(settings(VIRTUAL_DEVICES="2"), gpu_selection(2), {})
    assert (devices.kind, devices.logical, devices.max_replicas) == ("GPU", True, 2)
    assert devices.child_devices(2) == (2, "0")


def test_too_many_replicas_is_a_config_error_that_says_the_fix() -> None:
    chosen = settings(BENCH_REPLICAS="1,4")
    devices = plan_devices(chosen, cpu_selection(), {})
    with pytest.raises(ConfigError, match="VIRTUAL_DEVICES=4"):
        replica_counts(chosen, devices)
    gpus = plan_devices(chosen, gpu_selection(2), {})
    with pytest.raises(ConfigError, match="2 GPU"):
        replica_counts(chosen, gpus)


def test_points_cover_every_axis() -> None:
    chosen = settings(
        VIRTUAL_DEVICES="2", BENCH_SWEEP="precision,xla", BENCH_DATA="both", BATCH_SIZE="32"
    )
    bf16_cpu = frozenset({"avx512_bf16"})
    decided = choose_precision(chosen.mixed_precision, "CPU", (), bf16_cpu)
    points = plan_points(chosen, plan_devices(chosen, cpu_selection(), {}), decided)
    assert len(points) == 2 * 2 * 2 * 2  # data x precision x xla x replicas
    assert {p.mixed_precision for p in points} == {"0", "bf16"}  # 1 is bf16 on the CPU
    assert {p.xla for p in points} == {False, True}
    assert {p.data for p in points} == {"synthetic", "real"}
    assert {(p.replicas, p.global_batch) for p in points} == {(1, 32), (2, 64)}
    assert {p.variant for p in points} >= {"fp32", "mixed(bf16)+xla+real-data"}


def test_mixed_precision_1_is_fp16_on_tensor_core_gpus_and_fp32_before_them() -> None:
    """The sweep's second precision is what the runtime says MIXED_PRECISION=1 picks."""
    chosen = settings(BENCH_SWEEP="precision")
    devices = plan_devices(chosen, gpu_selection(2), {})

    def modes(capability: tuple[int, int]) -> set[str]:
        decided = choose_precision(chosen.mixed_precision, "GPU", [capability] * 2)
        return {p.mixed_precision for p in plan_points(chosen, devices, decided)}

    assert modes((8, 0)) == {"0", "fp16"}
    assert modes((6, 1)) == {"0"}


def test_spec_round_trips_through_json() -> None:
    chosen = settings(VIRTUAL_DEVICES="2")
    decided = choose_precision(chosen.mixed_precision, "CPU")
    spec = plan_points(chosen, plan_devices(chosen, cpu_selection(), {}), decided)[-1]
    assert PointSpec.from_json(spec.to_json()) == spec


def test_parse_child_output_takes_the_result_line() -> None:
    out = 'noise\nMGPU_BENCH_RESULT {"interval_seconds": [1.0]}\nmore noise\n'
    assert parse_child_output(out) == {"interval_seconds": [1.0]}
    assert parse_child_output("no result") is None


# -------------------------------------------------------------------------- the report


def run_fake(**values: str) -> dict[str, Any]:
    chosen = settings(**values)
    report = run_bench(runtime_of(chosen), environ={}, runner=fake_runner())
    return report.as_dict()


def test_bench_json_holds_points_settings_devices_and_efficiencies(tmp_path: Path) -> None:
    chosen = settings(VIRTUAL_DEVICES="4", BENCH_STEPS="10", BENCH_INTERVALS="4",
                      BATCH_SIZE="64")
    report = run_bench(runtime_of(chosen), environ={}, runner=fake_runner())
    path = write_results(report, tmp_path / "out")
    data = json.loads(path.read_text())

    assert path.name == "bench.json"
    assert data["settings"]["VIRTUAL_DEVICES"] == "4"
    assert data["settings"]["BENCH_MODEL"] == "mlp"
    assert data["devices"]["kind"] == "CPU" and data["devices"]["logical"] is True
    assert data["method"]["steps_per_interval"] == 10
    assert [p["replicas"] for p in data["points"]] == [1, 2, 4]

    one, two, four = data["points"]
    # 10 steps x 64 samples in 0.1 s (median interval)
    assert one["samples_per_s"]["median"] == pytest.approx(6400.0)
    assert one["step_time_ms"]["median"] == pytest.approx(10.0)
    assert two["global_batch"] == 128
    assert two["samples_per_s"]["median"] == pytest.approx(2 * 6400.0 * 0.9)
    assert two["samples_per_s_per_replica"] == pytest.approx(6400.0 * 0.9)
    assert one["efficiency"] == pytest.approx(1.0)
    assert four["efficiency"] == pytest.approx(0.9)
    assert data["efficiency"] == {"fp32": pytest.approx({"1": 1.0, "2": 0.9, "4": 0.9})}
    assert four["worker"]["devices"] == [f"/device:CPU:{i}" for i in range(4)]
    assert len(four["interval_seconds"]) == 4
    assert data["seed_comparison"] is None
    assert any("sharing its cores" in note for note in data["notes"])


def test_input_pipeline_cost_pairs_real_with_synthetic() -> None:
    data = run_fake(VIRTUAL_DEVICES="2", BENCH_DATA="both")
    costs = data["input_pipeline_cost"]
    assert [c["replicas"] for c in costs] == [1, 2]
    assert costs[0]["throughput_lost"] == pytest.approx(1 - 1 / 1.25)
    assert costs[0]["significant"] is True


def test_all_data_pairs_the_kept_and_the_streamed_input_with_synthetic() -> None:
    data = run_fake(VIRTUAL_DEVICES="2", BENCH_DATA="all")
    assert {p["variant"] for p in data["points"]} == {
        "fp32", "fp32+real-data", "fp32+stream-data"
    }
    costs = {(c["data"], c["replicas"]): c["throughput_lost"] for c in data["input_pipeline_cost"]}
    assert set(costs) == {("real", 1), ("real", 2), ("stream", 1), ("stream", 2)}
    assert costs["stream", 1] == pytest.approx(1 - 1 / 1.5)


def test_the_input_cost_is_paired_round_by_round() -> None:
    # The machine's load changes from round to round; the two intervals of a round share
    # it. Medians alone (2.0 s each) would say the kept data costs nothing.
    synthetic, kept = [1.0, 2.0, 4.0], [1.25, 2.0, 8.0]
    cpu = {"synthetic": [1.0, 1.0, 1.0], "real": [1.1, 1.1, 1.0]}  # this process's CPU time

    def runner(group: Group) -> list[dict[str, Any]]:
        return [{"interval_seconds": synthetic if spec.data == "synthetic" else kept,
                 "interval_cpu_seconds": cpu[spec.data], "device_type": "CPU"}
                for spec in group]

    chosen = settings(BENCH_DATA="both", BENCH_INTERVALS="3", BENCH_STEPS="10")
    data = run_bench(runtime_of(chosen), environ={}, runner=runner).as_dict()
    (cost,) = data["input_pipeline_cost"]
    assert cost["synthetic_samples_per_s"] == cost["real_samples_per_s"]
    assert cost["throughput_lost_rounds"] == pytest.approx([0.2, 0.0, 0.5])
    assert cost["throughput_lost"] == pytest.approx(0.2)
    lost = cost["throughput_lost_spread"]
    assert (lost["minimum"], lost["maximum"]) == pytest.approx((0.0, 0.5))
    assert (lost["q1"], lost["q3"]) == pytest.approx((0.1, 0.35))
    # 1.58 x IQR / sqrt(3 rounds): three rounds this far apart do not tell it from 0.
    assert cost["throughput_lost_ci95"] == pytest.approx(1.58 * 0.25 / 3**0.5)
    assert cost["significant"] is False
    assert cost["step_time_added_ms"] == pytest.approx(25.0)  # median of 25, 0, 400 ms/step
    assert cost["cpu_throughput_lost"] == pytest.approx(1 - 1 / 1.1)  # per CPU second
    assert data["schema_version"] == 3
    assert {p["child"] for p in data["points"]} == {0}


def test_the_profiled_input_wait_stands_beside_the_throughput_lost() -> None:
    # Two readings of one cost: the rounds' throughput, and the profiled step's input share
    # beyond its synthetic twin's (a child's result with the per-step split only).
    shares = {"synthetic": 0.01, "real": 0.07}

    def runner(group: Group) -> list[dict[str, Any]]:
        return [{"interval_seconds": [1.0] * 3 if spec.data == "synthetic" else [1.25] * 3,
                 "explain": {"split": {"share": {"input": shares[spec.data]}}}}
                for spec in group]

    chosen = settings(BENCH_DATA="both", BENCH_INTERVALS="3")
    (cost,) = run_bench(runtime_of(chosen), environ={}, runner=runner).as_dict()[
        "input_pipeline_cost"]
    assert cost["throughput_lost"] == pytest.approx(0.2)
    assert cost["profiled_input_wait"] == pytest.approx(0.06)
    assert cost["profiled_input_cost"] == pytest.approx(0.06)
    assert "per-step split" in cost["profiled_from"] and "profiled_pipeline" not in cost
    assert cost["readings_apart"] == pytest.approx(0.14)
    # 20% lost, 6% waiting and no CPU clock here: neither reading accounts for it.
    assert cost["input_cost_kind"] == "unexplained"
    table = render_costs([cost])
    assert [column.header for column in table.columns][-2:] == ["profiled", "how"]
    assert list(table.columns[-2].cells) == ["6.0%"] and list(table.columns[-1].cells) == ["?"]
    # Without a profile, no second reading and no column.
    del cost["profiled_input_cost"], cost["input_cost_kind"]
    assert [column.header for column in render_costs([cost]).columns][-1] == "noise?"


@pytest.mark.parametrize(("device_type", "cost_share", "kind"), [
    ("CPU", 0.161, "cpu"),  # the step computes on the cores the pipeline took
    ("GPU", 0.011, "unexplained"),  # the host's threads cost a GPU's step only its wait
])
def test_the_timed_feeds_trace_is_the_reading_where_explain_traced_it(
    device_type: str, cost_share: float, kind: str
) -> None:
    # The child traced intervals of the timed feed itself: that reading wins over the
    # per-step split's (0.5 here), with the cost share the child computed for its devices.
    traced = {"synthetic": {"traced": 3, "steps": 100, "wait_share": 0.001,
                            "pipeline_share": 0.0, "cost_share": 0.001},
              "real": {"traced": 3, "steps": 100, "wait_share": 0.011,
                       "pipeline_share": 0.15, "cost_share": cost_share}}

    def runner(group: Group) -> list[dict[str, Any]]:
        return [{"interval_seconds": [1.0] * 3 if spec.data == "synthetic" else [1.25] * 3,
                 "device_type": device_type,
                 "explain": {"split": {"share": {"input": 0.5}},
                             "timed_feed_input": traced[spec.data]}}
                for spec in group]

    chosen = settings(BENCH_DATA="both", BENCH_INTERVALS="3")
    (cost,) = run_bench(runtime_of(chosen), environ={}, runner=runner).as_dict()[
        "input_pipeline_cost"]
    assert cost["profiled_input_cost"] == pytest.approx(cost_share - 0.001)
    assert cost["profiled_input_wait"] == pytest.approx(0.01)
    assert cost["profiled_pipeline"] == pytest.approx(0.15)
    assert cost["profiled_from"] == "3 traced intervals of the timed feed"
    assert cost["readings_apart"] == pytest.approx(0.2 - (cost_share - 0.001))
    # 20% lost; the step waits 1%; on CPU devices the pipeline took 15% of the cores: the
    # profile accounts for it within 5 points. On a GPU nothing does.
    assert cost["input_cost_kind"] == kind


@pytest.mark.parametrize(("lost", "wait", "cpu_lost", "kind"), [
    (0.07, 0.003, 0.08, "cpu"),  # logical CPU devices: the input takes cores, not time
    (0.07, 0.003, None, "unexplained"),  # no CPU clock, and the step does not wait
    (0.30, 0.28, 0.02, "waiting"),  # a GPU's step starved by its pipeline
    (0.30, 0.28, 0.30, "waiting"),  # both agree: the wait is the direct one
    (0.30, 0.10, 0.10, "unexplained"),  # neither reading accounts for 30%
    (0.02, 0.01, 0.03, "none"), (-0.03, None, 0.0, "none"),  # within the readings' noise
    (0.02, 0.20, None, "unexplained"),  # a long wait that costs no throughput: odd, said
    (-0.20, 0.0, 0.0, "unexplained"),  # real data 20% faster than synthetic: odd, said
    (0.10, None, None, None),  # no direct reading at all
    (0.10, 0.05, None, "waiting"), (0.10, 0.0499, None, "unexplained"),  # the edge, 5 points
])
def test_how_the_input_costs_is_the_reading_that_accounts_for_the_loss(
    lost: float, wait: float | None, cpu_lost: float | None, kind: str | None
) -> None:
    from mgpu_env.bench.results import input_cost_kind

    assert input_cost_kind(lost, wait, cpu_lost) == kind


@pytest.mark.parametrize(("lost", "wait", "pipeline", "kind"), [
    (0.10, 0.01, 0.08, "cpu"),  # wait + the pipeline's cores account for it
    (0.10, 0.01, 0.0401, "cpu"), (0.10, 0.01, 0.0399, "unexplained"),  # the 5-point edge
    (0.10, 0.06, 0.02, "waiting"),  # both, the wait the larger part
    (0.10, 0.09, 0.08, "unexplained"),  # the wait alone would, but the reading is 17%
    (0.02, 0.01, 0.02, "none"), (0.02, 0.01, 0.04, "cpu"),  # 5% read, 2% lost: agree
    (0.02, 0.01, 0.10, "unexplained"),  # threads busy 10% of the cores, nothing lost: odd
    (0.10, None, 0.08, "cpu"),  # a pipeline reading without a wait reading
])
def test_the_pipelines_share_of_the_cores_is_a_reading_of_its_own(
    lost: float, wait: float | None, pipeline: float, kind: str
) -> None:
    from mgpu_env.bench.results import input_cost_kind

    assert input_cost_kind(lost, wait, None, pipeline) == kind


@pytest.mark.parametrize(("lost", "wait", "pipeline", "cpu_lost", "kind"), [
    # 2 logical CPU devices, the stream: 11% lost, as much more CPU per sample, but the
    # profile saw its threads take 0.7% of the cores and the steps wait 0.2%: the step.
    (0.111, 0.002, 0.007, 0.094, "step"),
    (0.111, 0.002, None, 0.094, "cpu"),  # no profile: the CPU clock cannot tell which
    (0.111, 0.002, 0.08, 0.094, "cpu"),  # the pipeline's threads took it
    (0.111, 0.002, 0.007, 0.02, "unexplained"),  # no reading accounts for 11%
    # Kept rows 5.8% faster than synthetic, 1.4% less CPU per sample: a gain, not a cost.
    (-0.058, 0.0, 0.0, -0.014, "unexplained"),
])
def test_extra_cpu_outside_the_pipelines_threads_is_the_steps(
    lost: float, wait: float, pipeline: float | None, cpu_lost: float, kind: str
) -> None:
    from mgpu_env.bench.results import input_cost_kind

    assert input_cost_kind(lost, wait, cpu_lost, pipeline) == kind


def test_a_cost_whose_rounds_straddle_zero_is_noise() -> None:
    # Under 6 rounds, a narrow notch is not enough: one round of 4 saw a gain.
    synthetic, kept = [1.0] * 4, [1.0 / (1 - c) for c in (0.10, 0.11, 0.11, -0.02)]
    chosen = settings(BENCH_DATA="both", BENCH_INTERVALS="4")

    def runner(group: Group) -> list[dict[str, Any]]:
        return [{"interval_seconds": synthetic if spec.data == "synthetic" else kept}
                for spec in group]

    (cost,) = run_bench(runtime_of(chosen), environ={}, runner=runner).as_dict()[
        "input_pipeline_cost"]
    assert cost["throughput_lost"] > cost["throughput_lost_ci95"]
    assert cost["significant"] is False
    # Rounds on both sides of 0, median 0.
    synthetic, kept = [1.0] * 4, [0.8, 1.1, 1.2, 0.9]
    (cost,) = run_bench(runtime_of(chosen), environ={}, runner=runner).as_dict()[
        "input_pipeline_cost"]
    assert cost["significant"] is False
    # Over 100 rounds a spread from -5% to 9% pins the median down: 2% is then measured.
    synthetic, kept = [1.0] * 100, [1.0 / (1 - c) for c in [-0.05, 0.02, 0.02, 0.09] * 25]
    chosen = settings(BENCH_DATA="both", BENCH_INTERVALS="100")
    (cost,) = run_bench(runtime_of(chosen), environ={}, runner=runner).as_dict()[
        "input_pipeline_cost"]
    assert cost["throughput_lost"] == pytest.approx(0.02)
    assert cost["significant"] is True


def test_input_alone_says_from_which_replica_count_the_stream_limits_the_step() -> None:
    data = run_fake(VIRTUAL_DEVICES="2", BENCH_DATA="all")
    kept, streamed = data["input_alone"]
    assert (kept["variant"], kept["measured"], kept["skipped"]) == (
        "fp32+real-data", False, KEPT_REASON)
    assert streamed["variant"] == "fp32+stream-data"
    # 8,000 samples/s alone; the synthetic step takes 6,400 at 1 replica, 11,520 at 2.
    assert [(r["replicas"], r["step_samples_per_s"], r["keeps_up"])
            for r in streamed["by_replicas"]] == [
        (1, pytest.approx(6400.0), True), (2, pytest.approx(11520.0), False)]
    assert (streamed["keeps_up"], streamed["limits_from"]) == (False, 2)
    fast = run_bench(runtime_of(settings(VIRTUAL_DEVICES="2", BENCH_DATA="all")), environ={},
                     runner=fake_runner(stream_alone=20_000.0)).as_dict()["input_alone"][1]
    assert (fast["keeps_up"], fast["limits_from"]) == (True, None)
    # No synthetic point: the stream's own samples/s (6,400 / 1.5 at 1 replica) stand in.
    (alone,) = run_fake(BENCH_DATA="stream")["input_alone"]
    (row,) = alone["by_replicas"]
    assert (row["step_from"], row["step_samples_per_s"]) == ("this point",
                                                             pytest.approx(6400 / 1.5))


@pytest.mark.parametrize(("steps", "advice"), [("50", "BENCH_STEPS=83 "), ("200", "=249 "),
                                               ("166", None)])
def test_a_note_says_when_the_streams_chunks_do_not_divide_the_intervals(
    steps: str, advice: str | None
) -> None:
    notes = run_fake(BENCH_DATA="all", BENCH_STEPS=steps)["notes"]
    chunk_notes = [note for note in notes if "chunks of 83 steps" in note]
    if advice is None:
        assert not chunk_notes
    else:
        (note,) = chunk_notes
        assert f"BENCH_STEPS={steps} is not a multiple of 83" in note and advice in note


def test_seed_comparison_reuses_the_sweeps_point_and_reports_the_ratio() -> None:
    calls: list[PointSpec] = []
    runner = fake_runner(seed_slowdown=3.0)

    def counting(group: Group) -> list[dict[str, Any]]:
        calls.extend(group)
        return runner(group)

    chosen = settings(VIRTUAL_DEVICES="2", BENCH_COMPARE="1")
    data = run_bench(runtime_of(chosen), environ={}, runner=counting).as_dict()
    assert [s.runner for s in calls] == ["seed", "mgpu", "mgpu"]  # no extra mgpu point
    comparison = data["seed_comparison"]
    assert comparison["ratio"] == pytest.approx(3.0)
    assert comparison["seed"]["runner"] == "seed"
    assert len(data["points"]) == 2  # the seed is not a sweep point


def test_every_point_reads_files_under_trainings_keep_limit(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.input import keep
    from mgpu_env.training.run.plan import plan_keep

    calls: list[PointSpec] = []
    runner = fake_runner()

    def counting(group: Group) -> list[dict[str, Any]]:
        calls.extend(group)
        return runner(group)

    # The host's memory, as `mgpu train` would read it, fixed so both readings agree.
    monkeypatch.setattr(keep, "host_available_bytes", lambda *a: 6 * keep.GIB)
    runtime = runtime_of(settings(VIRTUAL_DEVICES="2", BENCH_COMPARE="1"))
    run_bench(runtime, environ={}, runner=counting)
    trainings = plan_keep(runtime, workers=1).bytes
    assert trainings not in (0, keep.FALLBACK_BYTES)  # a limit that is not the fixed one
    assert [s.keep_bytes for s in calls] == [trainings] * 3  # the seed's point too
    assert [s.runner for s in calls] == ["seed", "mgpu", "mgpu"]  # the twin is still shared


def test_seed_comparison_runs_its_own_fp32_point_when_the_sweep_has_none() -> None:
    calls: list[PointSpec] = []
    runner = fake_runner()

    def counting(group: Group) -> list[dict[str, Any]]:
        calls.extend(group)
        return runner(group)

    chosen = settings(BENCH_COMPARE="1", MIXED_PRECISION="bf16")
    data = run_bench(runtime_of(chosen), environ={}, runner=counting).as_dict()
    assert [(s.runner, s.mixed_precision) for s in calls] == [
        ("seed", "0"), ("mgpu", "0"), ("mgpu", "bf16")
    ]
    assert data["seed_comparison"]["mgpu"]["precision"] == "fp32"


def test_seed_comparison_leaves_a_dataset_loader_out() -> None:
    # A loader's samples would give the mgpu twin their shape; the seed trains on MNIST rows.
    chosen = settings(BENCH_COMPARE="1", DATASET="mydata:load", GPUS="none")
    seed, mgpu = comparison_points(chosen, plan_devices(chosen, cpu_selection(), {}))
    assert (seed.runner, seed.dataset, mgpu.dataset) == ("seed", "synthetic", "synthetic")
    plain = settings(BENCH_COMPARE="1", DATASET="digits", GPUS="none")
    assert comparison_points(plain, plan_devices(plain, cpu_selection(), {}))[1].dataset == (
        "digits"
    )


def test_a_failed_point_is_recorded_and_the_sweep_goes_on() -> None:
    runner = fake_runner()

    def flaky(group: Group) -> list[dict[str, Any]]:
        if group[0].replicas == 2:
            raise bench.RunFailed("out of memory")
        return runner(group)

    chosen = settings(VIRTUAL_DEVICES="4")
    report = run_bench(runtime_of(chosen), environ={}, runner=flaky)
    assert [p["replicas"] for p in report.failed] == [2]
    assert report.as_dict()["efficiency"]["fp32"].keys() == {"1", "4"}


def test_a_point_past_bench_timeout_is_stopped_and_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess

    timeouts: list[float | None] = []

    def hung_child(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        timeouts.append(timeout)
        raise subprocess.TimeoutExpired(args[0], timeout or 0)

    monkeypatch.setattr(bench.subprocess, "run", hung_child)
    chosen = settings(VIRTUAL_DEVICES="2", BENCH_TIMEOUT="45", BENCH_DATA="both")
    report = run_bench(runtime_of(chosen), environ={})
    assert timeouts == [90, 90]  # one child per replica count, 45 s for each of its 2 points
    assert [p["error"] for p in report.failed] == ["timed out after 90 s"] * 4


def test_a_failed_group_child_marks_each_of_its_points_failed() -> None:
    runner = fake_runner()
    groups: list[list[tuple[int, str]]] = []

    def flaky(group: Group) -> list[dict[str, Any]]:
        groups.append([(spec.replicas, spec.data) for spec in group])
        if group[0].replicas == 2:
            raise bench.RunFailed(f"{bench.describe_group(group)}: out of memory")
        return runner(group)

    chosen = settings(VIRTUAL_DEVICES="2", BENCH_DATA="all")
    report = run_bench(runtime_of(chosen), environ={}, runner=flaky)
    # One child per replica count, measuring the three data variants together.
    assert groups == [[(1, "synthetic"), (1, "real"), (1, "stream")],
                      [(2, "synthetic"), (2, "real"), (2, "stream")]]
    assert sorted(p["data"] for p in report.failed) == ["real", "stream", "synthetic"]
    assert {p["replicas"] for p in report.failed} == {2}
    assert {p["error"] for p in report.failed} == {
        "the 2-replica point (fp32; synthetic, real, stream data): out of memory"
    }
    costs = report.as_dict()["input_pipeline_cost"]
    assert [(c["data"], c["replicas"]) for c in costs] == [("real", 1), ("stream", 1)]


def test_impossible_all_reduce_is_refused_before_any_child() -> None:
    def never(group: Group) -> list[dict[str, Any]]:
        raise AssertionError("no child may start")

    chosen = settings(VIRTUAL_DEVICES="2", CROSS_DEVICE_OPS="nccl")
    with pytest.raises(ConfigError, match="nccl"):
        run_bench(runtime_of(chosen), environ={}, runner=never)


def test_bf16_on_old_gpus_is_refused_before_any_child() -> None:
    chosen = settings(MIXED_PRECISION="bf16")
    with pytest.raises(ConfigError, match="bf16"):
        run_bench(runtime_of(chosen, gpu_selection(1, (7, 0)).gpus), runner=fake_runner())


# ---------------------------------------------------------------- interleaved rounds


@pytest.mark.parametrize("variants", [2, 3, 4, 5])
def test_over_a_cycle_each_variant_follows_every_other_equally_often(variants: int) -> None:
    cycle = 2 * variants if variants % 2 else variants
    orders = round_orders(variants, cycle)
    assert all(sorted(order) == list(range(variants)) for order in orders)
    follows = Counter(itertools.chain.from_iterable(itertools.pairwise(o) for o in orders))
    assert set(follows) == set(itertools.permutations(range(variants), 2))
    assert len(set(follows.values())) == 1


def test_two_variants_swap_every_round() -> None:
    assert round_orders(2, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert round_orders(1, 3) == [[0], [0], [0]]


def test_a_variant_alone_runs_its_intervals_back_to_back() -> None:
    log: list[int] = []
    time_interleaved([log.append], Schedule(0, 5, 3), clock=lambda: 0.0)
    # No other variant breaks its run: no lead-in, the untimed round and 3 timed intervals.
    assert log == [5] * 4
    assert lead_in_steps(1, 5) == 0 and lead_in_steps(2, 5) == 5


def test_interleaved_rounds_time_one_interval_of_each_variant_in_turn() -> None:
    now, log = [0.0], []

    def steps_of(name: str, step_s: float) -> Callable[[int], None]:
        def run(count: int) -> None:
            log.append((name, count))
            now[0] += count * step_s

        return run

    names = ["synthetic", "real", "stream"]
    runs = [steps_of(n, s) for n, s in zip(names, [1.0, 1.25, 1.5], strict=True)]
    timings = time_interleaved(runs, Schedule(7, 5, 4), clock=lambda: now[0])
    # Warm-up: each variant on its own, 7 steps rounded up to whole intervals (a stream's
    # timed intervals then start at a chunk's start); one untimed round; the timed rounds.
    assert log[:6] == [("synthetic", 5), ("synthetic", 5), ("real", 5), ("real", 5),
                       ("stream", 5), ("stream", 5)]
    assert log[6:9] == [(n, 5) for n in names]
    # Each timed interval after an untimed lead-in of its own variant (one interval's steps).
    assert log[9:] == [(names[v], 5) for order in round_orders(3, 4) for v in order
                       for _ in ("lead-in", "timed")]
    assert [t.seconds for t in timings] == [[5.0] * 4, [6.25] * 4, [7.5] * 4]
    rounds = [sorted(t.starts[i] for t in timings) for i in range(4)]
    assert rounds[0][0] == 0.0
    assert all(a[-1] < b[0] for a, b in itertools.pairwise(rounds))


# ------------------------------------------------------- real TensorFlow, in this process


def mirrored_over(devices: tuple[str, ...]) -> Any:
    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy

    return make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, len(devices))))


def small_arrays(rows: int = 100, features: int = 3) -> Any:
    import numpy as np

    from mgpu_env.training.input.data import Arrays

    rng = np.random.default_rng(0)
    x = rng.random((rows, features), dtype=np.float32)
    y = (np.arange(rows) % 10).astype(np.int32)
    return Arrays("small", x, y, x[:10], y[:10])


def test_a_chunked_stream_alone_counts_samples_from_its_chunks_and_stops_at_its_end(
    logical_cpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.training.input.feeds import arrays_stream as stream

    # Chunks of 5 steps: 4 rows of 3 float32 features and a label each per replica.
    monkeypatch.setattr(stream, "STREAM_CHUNK_BYTES", 5 * 4 * (3 + 1) * 4)
    strategy = mirrored_over(logical_cpus[:2])
    feed = stream.StreamFeed(strategy, small_arrays(), 8, 42, steps_per_epoch=100 // 8)
    assert (feed.steps_per_epoch, feed.steps_per_chunk) == (12, 5)
    # 2 epochs: 24 batches but 5 elements (chunks of 5, 5, 5, 5 and 4 steps per replica).
    # The first is the warm-up; the budget is never reached: the stream ends first.
    timed = time_dataset(feed.dataset(Position(0), 2), strategy, True, SampleBudget(1, 10**9))
    assert (timed["elements"], timed["samples"]) == (4, (5 + 5 + 5 + 4) * 8)
    assert timed["samples_per_s"] > 0
    # Sized by measure_input_alone: enough epochs for the least elements it times.
    alone = measure_input_alone(feed, strategy, SampleBudget(8, 0))
    assert (alone["elements"], alone["samples"]) == (MIN_TIMED_ELEMENTS, 32 * 5 * 8)
    # One element of a stream with nothing after it: nothing to time, and no error.
    short = time_dataset(stream.StreamFeed(strategy, small_arrays(20), 8, 42,
                                          steps_per_epoch=20 // 8).dataset(Position(0), 1),
                         strategy, True, SampleBudget(1, 10**9))
    assert short["samples_per_s"] is None and "warm-up" in short["skipped"]


def test_a_loaders_stream_alone_counts_per_replica_batches(
    logical_cpus: tuple[str, ...]
) -> None:
    import tensorflow as tf

    from mgpu_env.training.input.feeds import ResidentFeed, RowStreamFeed

    strategy = mirrored_over(logical_cpus[:2])
    arrays = small_arrays()
    rows = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train))
    feed = RowStreamFeed(strategy, rows, arrays.train_size, 8, 42,
                         steps_per_epoch=arrays.train_size // 8)
    alone = measure_input_alone(feed, strategy, SampleBudget(8, 80))
    # Each element is one global batch, 4 rows on each of the 2 replicas.
    assert (alone["elements"], alone["samples"]) == (MIN_TIMED_ELEMENTS, 32 * 8)
    resident = ResidentFeed.place(strategy, arrays, 8, 42, steps_per_epoch=arrays.train_size // 8)
    kept = measure_input_alone(resident, strategy, SampleBudget(8, 80))
    assert kept == {"samples_per_s": None, "skipped": KEPT_REASON}
    assert element_samples([(tf.zeros((3, 4, 2)), tf.zeros((3, 4)))], chunked=True) == 12
    assert element_samples([(tf.zeros((3, 4, 2)), tf.zeros((3, 4)))], chunked=False) == 3


def test_one_child_measures_its_data_variants_in_alternating_rounds(
    logical_cpus: tuple[str, ...]
) -> None:
    """The group child's own code, on 2 of this process's logical CPUs: synthetic, kept and
    streamed digits, one trainer each, their intervals taking turns."""
    from mgpu_env.bench.worker import measure_variants
    from mgpu_env.runtime import Execution

    chosen = settings(VIRTUAL_DEVICES="2", DATASET="digits", BENCH_DATA="all",
                      BATCH_SIZE="16", BENCH_WARMUP="2", BENCH_STEPS="3", BENCH_INTERVALS="3")
    runtime = runtime_of(chosen)
    devices = plan_devices(chosen, runtime.selection, {})
    specs = attach_executions(plan_points(chosen, devices, runtime.precision), devices, runtime)
    (group,) = [g for g in group_points(specs) if g[0].replicas == 2]
    results = measure_variants(group, mirrored_over(logical_cpus[:2]),
                               Execution.from_json(group[0].execution))
    assert [r["measured_with"] for r in results] == [["synthetic", "real", "stream"]] * 3
    assert all(len(r["interval_seconds"]) == len(r["interval_starts"]) == 3 for r in results)
    # Sorted by start, the intervals follow the rounds' orders: they alternate.
    started = sorted((start, v) for v, r in enumerate(results)
                     for start in r["interval_starts"])
    assert [v for _, v in started] == [v for order in round_orders(3, 3) for v in order]
    synthetic, kept, streamed = results
    assert "input_alone" not in synthetic
    assert kept["input_alone"]["skipped"] == KEPT_REASON
    alone = streamed["input_alone"]
    # Each element is a chunk of whole steps' batches for each replica: 32 samples a step.
    assert alone["samples_per_s"] > 0 and alone["samples"] % 32 == 0
    assert alone["elements"] >= MIN_TIMED_ELEMENTS


# ---------------------------------------------------------------------------- the plot


def test_plot_is_a_png_matplotlib_reads_back(tmp_path: Path) -> None:
    import matplotlib.image

    data = run_fake(VIRTUAL_DEVICES="4", BENCH_SWEEP="xla")
    path = plot_bench(data, tmp_path / "bench.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_every_axis_of_the_plot_starts_at_0() -> None:
    import matplotlib.pyplot as plt

    data = run_fake(VIRTUAL_DEVICES="4", BENCH_SWEEP="xla")
    lowest = min(p["samples_per_s"]["q1"] for p in data["points"])
    assert lowest > 5000  # matplotlib alone would start the throughput axis near it
    figure = draw_bench(data)
    try:
        throughput, efficiency = figure.axes
        for axes in (throughput, efficiency):
            assert axes.get_ylim()[0] == 0 and axes.get_xlim()[0] == 0, axes.get_title()
        assert throughput.get_ylim()[1] >= max(p["samples_per_s"]["q3"] for p in data["points"])
    finally:
        plt.close(figure)


def test_the_interval_beside_the_median_is_the_medians() -> None:
    point = run_fake(VIRTUAL_DEVICES="2", BENCH_INTERVALS="4")["points"][0]
    samples = point["samples_per_s"]
    assert samples["median_ci95"] == pytest.approx(1.58 * samples["iqr"] / 4**0.5)
    assert samples["median_ci95"] != pytest.approx(samples["ci95"])  # the mean's, unprinted


# ----------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BENCH_REPLICAS": "two"}, "BENCH_REPLICAS"),
        ({"BENCH_MODEL": "vgg"}, "BENCH_MODEL"),
        ({"BENCH_SWEEP": "batch"}, "BENCH_SWEEP"),
        ({"BENCH_INTERVALS": "1"}, "BENCH_INTERVALS"),
        ({"BENCH_REPLICAS": "4"}, "VIRTUAL_DEVICES=4"),
        ({"VIRTUAL_DEVICES": "2", "CROSS_DEVICE_OPS": "nccl"}, "nccl"),
    ],
)
def test_cli_bad_settings_exit_2(env: dict[str, str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["bench"], env={"GPUS": "none", "OUTPUT_DIR": str(tmp_path), **env}
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "bench.json").exists()


def test_cli_writes_json_and_png_and_prints_the_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bench, "run_child", fake_runner())
    result = CliRunner().invoke(
        app, ["bench", "--virtual-devices", "2", "--bench-compare"],
        env={"GPUS": "none", "OUTPUT_DIR": str(tmp_path), "COLUMNS": "120"},
    )
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.stdout and "90%" in result.stdout
    assert "mgpu/model.fit = 3.00x" in result.stdout
    assert "of the mean" not in result.stdout
    assert "the median's 95% confidence" in " ".join(result.stdout.split())
    data = json.loads((tmp_path / "bench.json").read_text())
    first = data["points"][0]["samples_per_s"]
    assert f"±{first['median_ci95']:,.0f}" in result.stdout
    assert json.loads((tmp_path / "bench.json").read_text())["points"]
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC


def test_cli_prints_the_costs_and_whether_the_input_keeps_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bench, "run_child", fake_runner())
    result = CliRunner().invoke(
        app, ["bench", "--virtual-devices", "2", "--bench-data", "all"],
        env={"GPUS": "none", "OUTPUT_DIR": str(tmp_path)},
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "input pipeline's cost" in out
    assert "20.0%" in out and "33.3%" in out  # kept 1 - 1/1.25, streamed 1 - 1/1.5
    verdicts = [line for line in out.splitlines() if line.startswith("input alone, ")]
    assert verdicts == [
        "input alone, fp32+real-data: kept on each device: no pipeline to time",
        "input alone, fp32+stream-data: limits the step from 2 replica(s)",
    ]
    assert all(len(line) <= 80 for line in verdicts)
    # The numbers behind it: 8,000 samples/s alone, 6,400 and 11,520 taken by the step.
    assert re.search(r"fp32\+stream-data\W+2\W+8,000\W+11,520\W+no", out)


def test_cli_exits_1_when_a_point_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def failing(group: Group, timeout_s: float | None = None) -> list[dict[str, Any]]:
        raise bench.RunFailed("the child died")

    monkeypatch.setattr(bench, "run_child", failing)
    result = CliRunner().invoke(app, ["bench"], env={"GPUS": "none",
                                                     "OUTPUT_DIR": str(tmp_path)})
    assert result.exit_code == 1
    assert "the child died" in result.stderr
    assert (tmp_path / "bench.json").exists()


# ------------------------------------------------------------------------ a real sweep


@pytest.mark.slow
def test_real_sweep_on_two_logical_cpus_with_the_seed_comparison(tmp_path: Path) -> None:
    """Real children, real TensorFlow: MLP at 1 and 2 replicas, and the seed's model.fit."""
    env = {
        "GPUS": "none", "VIRTUAL_DEVICES": "2", "OUTPUT_DIR": str(tmp_path),
        "BENCH_WARMUP": "3", "BENCH_STEPS": "5", "BENCH_INTERVALS": "3",
        "BENCH_COMPARE": "1", "BATCH_SIZE": "32", "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    result = CliRunner().invoke(app, ["bench"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [p["replicas"] for p in data["points"]] == [1, 2]
    for point in data["points"]:
        assert point["samples_per_s"]["median"] > 0
        assert len(point["interval_seconds"]) == 3
        assert point["worker"]["device_type"] == "CPU"
        assert point["worker"]["logical_devices"] is (point["replicas"] == 2)
        assert len(point["worker"]["devices"]) == point["replicas"]
        assert point["worker"]["parameters"] == 55050
    assert data["points"][0]["efficiency"] == 1.0
    assert data["points"][1]["efficiency"] > 0
    assert data["seed_comparison"]["ratio"] > 0
    assert data["seed_comparison"]["seed"]["worker"]["parameters"] == 55050
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC
    assert os.environ.get("CUDA_VISIBLE_DEVICES") in (None, "-1")


@pytest.mark.slow
def test_real_sweep_feeds_kept_and_streamed_data_on_two_logical_cpus(tmp_path: Path) -> None:
    """Real children: digits kept on each device and streamed by tf.data, 1 and 2 replicas;
    both cross epoch boundaries (22 steps per epoch at 1 replica)."""
    env = {
        "GPUS": "none", "VIRTUAL_DEVICES": "2", "OUTPUT_DIR": str(tmp_path),
        "DATASET": "digits", "BENCH_DATA": "all", "BENCH_WARMUP": "3", "BENCH_STEPS": "30",
        "BENCH_INTERVALS": "2", "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    result = CliRunner().invoke(app, ["bench"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert len(data["points"]) == 6 and not [p for p in data["points"] if p.get("error")]
    sources = {p["data"]: p["worker"].get("data_source", "") for p in data["points"]}
    assert "kept on each device" in sources["real"]
    assert "streamed from host memory by tf.data" in sources["stream"]
    # Two children, one per replica count, each measuring the three data variants.
    assert {(p["replicas"], p["child"]) for p in data["points"]} == {(1, 0), (2, 1)}
    assert len(data["input_pipeline_cost"]) == 4
    assert all(len(c["throughput_lost_rounds"]) == 2 for c in data["input_pipeline_cost"])
    (kept, streamed) = data["input_alone"]
    assert (kept["data"], kept["measured"]) == ("real", False)
    assert [row["replicas"] for row in streamed["by_replicas"]] == [1, 2]
    assert "input alone, fp32+stream-data: " in result.stdout
