"""`mgpu bench`: the plan, the report and bench.json, the plot, and the CLI's exit codes.

Children are replaced by a fake runner with known timings, so everything here but the
`slow` test runs without TensorFlow in milliseconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.bench import sweep as bench
from mgpu_env.bench.plot import plot_bench
from mgpu_env.bench.sweep import (
    PointSpec,
    comparison_points,
    parse_child_output,
    plan_devices,
    plan_points,
    replica_counts,
    run_bench,
    write_report,
)
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import GpuRequest, Settings
from mgpu_env.hardware.devices import GpuSelection
from mgpu_env.hardware.nvml import GpuInfo, Probed
from tests.runtimes import runtime_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def settings(**values: str) -> Settings:
    return resolve_settings(values, {}).settings


def cpu_selection() -> GpuSelection:
    return GpuSelection(GpuRequest("none"), (), "-1")


def gpu_selection(count: int, capability: tuple[int, int] = (8, 0)) -> GpuSelection:
    gpus = tuple(
        GpuInfo(i, "NVIDIA A100", f"GPU-{i}", compute_capability=Probed(capability))
        for i in range(count)
    )
    return GpuSelection(GpuRequest("all"), gpus, ",".join(str(i) for i in range(count)))


def fake_runner(
    base_step_s: float = 0.01, efficiency: float = 0.9, seed_slowdown: float = 3.0,
    real_slowdown: float = 1.25, stream_slowdown: float = 1.5,
) -> Callable[[PointSpec], dict[str, Any]]:
    """Timings of a device where each extra replica costs (1 - efficiency) of a step."""

    def run(spec: PointSpec, timeout_s: float | None = None) -> dict[str, Any]:
        # weak scaling: n replicas take base / efficiency(n) per step of n x batch
        step = base_step_s if spec.replicas == 1 else base_step_s / efficiency
        if spec.runner == "seed":
            step *= seed_slowdown
        if spec.data == "real":
            step *= real_slowdown
        if spec.data == "stream":
            step *= stream_slowdown
        interval = step * spec.steps_per_interval
        return {
            "interval_seconds": [interval * f for f in (1.0, 0.98, 1.02, 1.0)][: spec.intervals],
            "device_type": "CPU",
            "devices": [f"/device:CPU:{i}" for i in range(spec.replicas)],
            "logical_devices": spec.virtual_devices > 0,
            "parameters": 55050,
        }

    return run


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
    points = plan_points(chosen, plan_devices(chosen, cpu_selection(), {}), cpu_flags=bf16_cpu)
    assert len(points) == 2 * 2 * 2 * 2  # data x precision x xla x replicas
    assert {p.mixed_precision for p in points} == {"0", "bf16"}  # 1 is bf16 on the CPU
    assert {p.xla for p in points} == {False, True}
    assert {p.data for p in points} == {"synthetic", "real"}
    assert {(p.replicas, p.global_batch) for p in points} == {(1, 32), (2, 64)}
    assert {p.variant for p in points} >= {"fp32", "mixed(bf16)+xla+real-data"}


def test_mixed_precision_1_is_fp16_on_tensor_core_gpus_and_fp32_before_them() -> None:
    chosen = settings(BENCH_SWEEP="precision")
    devices = plan_devices(chosen, gpu_selection(2), {})
    assert {p.mixed_precision for p in plan_points(chosen, devices, [(8, 0)] * 2)} == {
        "0", "fp16"
    }
    assert {p.mixed_precision for p in plan_points(chosen, devices, [(6, 1)] * 2)} == {"0"}


def test_spec_round_trips_through_json() -> None:
    chosen = settings(VIRTUAL_DEVICES="2")
    spec = plan_points(chosen, plan_devices(chosen, cpu_selection(), {}))[-1]
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
    path = write_report(report, tmp_path / "out")
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


def test_seed_comparison_reuses_the_sweeps_point_and_reports_the_ratio() -> None:
    calls: list[PointSpec] = []
    runner = fake_runner(seed_slowdown=3.0)

    def counting(spec: PointSpec) -> dict[str, Any]:
        calls.append(spec)
        return runner(spec)

    chosen = settings(VIRTUAL_DEVICES="2", BENCH_COMPARE="1")
    data = run_bench(runtime_of(chosen), environ={}, runner=counting).as_dict()
    assert [s.runner for s in calls] == ["seed", "mgpu", "mgpu"]  # no extra mgpu point
    comparison = data["seed_comparison"]
    assert comparison["ratio"] == pytest.approx(3.0)
    assert comparison["seed"]["runner"] == "seed"
    assert len(data["points"]) == 2  # the seed is not a sweep point


def test_seed_comparison_runs_its_own_fp32_point_when_the_sweep_has_none() -> None:
    calls: list[PointSpec] = []
    runner = fake_runner()

    def counting(spec: PointSpec) -> dict[str, Any]:
        calls.append(spec)
        return runner(spec)

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

    def flaky(spec: PointSpec) -> dict[str, Any]:
        if spec.replicas == 2:
            raise bench.RunFailed("out of memory")
        return runner(spec)

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
    chosen = settings(VIRTUAL_DEVICES="2", BENCH_TIMEOUT="45")
    report = run_bench(runtime_of(chosen), environ={})
    assert timeouts == [45, 45]
    assert [p["error"] for p in report.failed] == ["timed out after 45 s"] * 2


def test_impossible_all_reduce_is_refused_before_any_child() -> None:
    def never(spec: PointSpec) -> dict[str, Any]:
        raise AssertionError("no child may start")

    chosen = settings(VIRTUAL_DEVICES="2", CROSS_DEVICE_OPS="nccl")
    with pytest.raises(ConfigError, match="nccl"):
        run_bench(runtime_of(chosen), environ={}, runner=never)


def test_bf16_on_old_gpus_is_refused_before_any_child() -> None:
    chosen = settings(MIXED_PRECISION="bf16")
    with pytest.raises(ConfigError, match="bf16"):
        run_bench(runtime_of(chosen, gpu_selection(1, (7, 0)).gpus), runner=fake_runner())


# ---------------------------------------------------------------------------- the plot


def test_plot_is_a_png_matplotlib_reads_back(tmp_path: Path) -> None:
    import matplotlib.image

    data = run_fake(VIRTUAL_DEVICES="4", BENCH_SWEEP="xla")
    path = plot_bench(data, tmp_path / "bench.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


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
    assert json.loads((tmp_path / "bench.json").read_text())["points"]
    assert (tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC


def test_cli_exits_1_when_a_point_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def failing(spec: PointSpec, timeout_s: float | None = None) -> dict[str, Any]:
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
    assert len(data["input_pipeline_cost"]) == 4
