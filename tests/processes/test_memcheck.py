"""`mgpu train`'s memory check: the model measured in a child before TensorFlow starts in the
process that trains (the child's numbers are the in-process ones, a user's MODEL included),
the dry run shows them, a GPU too small refuses the run with exit 2 before TensorFlow is
imported, and the first step's peak is recorded beside the estimate (null on the CPU)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_env import about
from mgpu_env.config.errors import ConfigError
from mgpu_env.estimate import memory
from mgpu_env.hardware.nvml import GpuInfo, Probed
from mgpu_env.runtime.precision import PrecisionChoice
from mgpu_env.training.run import memcheck
from mgpu_env.training.run.plan import plan_training
from mgpu_env.training.step import memprobe
from tests.support import train_process
from tests.support.children import REPO, child_env
from tests.support.cli_process import mgpu
from tests.support.memory import MLP_ACTIVATIONS, MLP_BYTES, canned_measure
from tests.support.runtimes import runtime_of

FLOAT32 = PrecisionChoice("float32", False, "MIXED_PRECISION=0")
MIB = 1 << 20


def mlp_request(batch: int = 64, model: str = "mlp") -> memprobe.MemoryRequest:
    return memprobe.MemoryRequest(model, 0, (784,), 10, batch, 1e-3, FLOAT32)


# ------------------------------------------------------------------------------ the child


@pytest.mark.slow
def test_the_childs_estimate_is_the_in_process_one(
    logical_cpus: tuple[str, ...], real_memory_child: Callable[..., Any], tmp_path: Path
) -> None:
    from mgpu_env.training.step.model import build_model, build_optimizer

    child = real_memory_child(mlp_request(), child_env(tmp_path / "home"))
    model = build_model(0)
    optimizer = build_optimizer(1e-3, loss_scaling=False)
    optimizer.build(model.trainable_variables)
    here, assumed = memory.measure(model, optimizer, 64, "float32")
    assert child.estimate == here and child.assumed == assumed == "" and child.note is None
    # Against the real variables: the weights, and Adam's two slots per trainable variable.
    assert child.estimate.weights == sum(v.numpy().nbytes for v in model.variables)
    slots = [v for v in optimizer.variables if len(v.shape) > 0]
    assert child.estimate.slots == sum(v.numpy().nbytes for v in slots)
    # What the in-process tests are answered with is this child's answer.
    assert canned_measure(mlp_request(), {}) == child


USER_MODELS = """
import keras

def wide(input_shape, num_classes):
    return keras.Sequential([keras.Input(shape=input_shape),
                             keras.layers.Dense(1000, activation="relu"),
                             keras.layers.Dense(num_classes, activation="softmax")])

def broken(input_shape, num_classes):
    raise ValueError("no such layer: Dense3000")
"""


@pytest.mark.slow
def test_a_users_model_is_estimated_in_the_child(
    tmp_path: Path, real_memory_child: Callable[..., Any]
) -> None:
    (tmp_path / "usermodels.py").write_text(USER_MODELS)
    env = child_env(tmp_path / "home", PYTHONPATH=f"{tmp_path}:{REPO}")
    wide = real_memory_child(mlp_request(32, "usermodels:wide"), env)
    params = 784 * 1000 + 1000 + 1000 * 10 + 10
    assert wide.estimate.weights == wide.estimate.gradients == params * 4
    assert wide.estimate.slots == 2 * params * 4
    assert wide.estimate.activations == (1000 + 10) * 4 * 32
    assert wide.note == ("MODEL=usermodels:wide was built on the CPU for this check: "
                         f"{params:,} parameters, outputs (batch, 10) for the data's 10 classes")
    with pytest.raises(ConfigError) as caught:
        real_memory_child(mlp_request(32, "usermodels:broken"), env)
    assert str(caught.value).startswith(
        "MODEL=usermodels:broken: build((784,), 10) raised ValueError: no such layer: "
        "Dense3000\n  Expected: build(input_shape, num_classes)")
    assert "Traceback" not in str(caught.value)


def test_a_child_that_gives_no_answer_is_said_not_raised(
    tmp_path: Path, real_memory_child: Callable[..., Any]
) -> None:
    # A child stopped before it answers: the run goes on, its summary says why there is no
    # estimate (a model that cannot be measured is not the user's setting's fault).
    plan = plan_training(runtime_of({"GPUS": "none", "OUTPUT_DIR": str(tmp_path / "run")}),
                         environ={})

    def stopped(request: memprobe.MemoryRequest, environ: Any) -> memprobe.Measured:
        return real_memory_child(request, child_env(tmp_path / "home"), 0.001)  # type: ignore[no-any-return]

    check = memcheck.check_memory(plan, _sizes(), dry_run=True, measure=stopped)
    assert check.estimate is None
    assert check.lines == (
        "not estimated: the child that builds the model did not answer within 0.001 s",)


# ---------------------------------------------------------------- when it runs, and where


def _sizes() -> Any:
    from mgpu_env.training.input.data import DataSizes

    return DataSizes(1437, 360)


def _gpu(index: int, total_mib: int | None) -> GpuInfo:
    return GpuInfo(index, "Tesla T4", f"GPU-{index}", memory_total_mib=Probed(total_mib),
                   memory_free_mib=Probed(total_mib), compute_capability=Probed((7, 5)))


# ------------------------------------------------------------------ kept between starts


def test_a_builtin_models_estimate_is_kept_and_a_users_is_measured_every_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[memprobe.MemoryRequest] = []

    def child(request: memprobe.MemoryRequest, environ: Any) -> memprobe.Measured:
        asked.append(request)
        return canned_measure(request, environ)

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = memprobe.measure(mlp_request(), env, child)
    again = memprobe.measure(mlp_request(), env, child)
    assert len(asked) == 1 and again == first
    kept = memprobe.cache_file(mlp_request(), env)
    assert kept is not None and kept.parent == tmp_path / "cache" / "mgpu" / "memory"
    # Another batch, another precision, another TensorFlow: another answer.
    memprobe.measure(mlp_request(32), env, child)
    mixed = dataclasses.replace(mlp_request(), precision=PrecisionChoice(
        "mixed_float16", True, "MIXED_PRECISION=1"))
    memprobe.measure(mixed, env, child)
    monkeypatch.setattr(about, "installed_version", lambda name: "9.9.9")
    memprobe.measure(mlp_request(), env, child)
    assert len(asked) == 4
    monkeypatch.undo()
    # A user's builder can change under its name (and what it imports): never kept.
    user = mlp_request(64, "usermodels:wide")
    assert memprobe.cache_file(user, env) is None
    built = memprobe.Measured(first.estimate, "", "built")
    memprobe.measure(user, env, lambda request, environ: asked.append(request) or built)
    memprobe.measure(user, env, lambda request, environ: asked.append(request) or built)
    assert len(asked) == 6


def test_a_torn_or_unwritable_cache_is_passed_by(tmp_path: Path) -> None:
    calls: list[int] = []

    def child(request: memprobe.MemoryRequest, environ: Any) -> memprobe.Measured:
        calls.append(1)
        return canned_measure(request, environ)

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    kept = memprobe.cache_file(mlp_request(), env)
    assert kept is not None
    kept.parent.mkdir(parents=True)
    kept.write_text('{"estimate": {"batch"', encoding="utf-8")  # torn by hand
    measured = memprobe.measure(mlp_request(), env, child)
    assert calls == [1] and memprobe.Measured.from_json(kept.read_text()) == measured
    # A cache folder that cannot be written (a read-only home): measured every start.
    blocked = {"XDG_CACHE_HOME": str(tmp_path / "file")}
    (tmp_path / "file").write_text("not a folder", encoding="utf-8")
    assert memprobe.measure(mlp_request(), blocked, child) == measured
    assert memprobe.measure(mlp_request(), blocked, child) == measured
    assert calls == [1, 1, 1]


@pytest.mark.slow
def test_a_second_dry_run_reads_the_kept_estimate_without_a_child(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = mgpu(tmp_path, "train", "--dry-run", "--json", GPUS="none", DATASET="digits",
                 XDG_CACHE_HOME=str(cache))
    assert first.returncode == 0, first.stderr
    (kept,) = (cache / "mgpu" / "memory").iterdir()
    answer = json.loads(kept.read_text(encoding="utf-8"))
    assert answer["estimate"] == json.loads(first.stdout)["memory"]["estimate"]
    # Marked: a second start shows what the cache holds, so no child measured it again.
    answer["estimate"]["activations"] += 1000
    kept.write_text(json.dumps(answer), encoding="utf-8")
    second = mgpu(tmp_path, "train", "--dry-run", "--json", GPUS="none", DATASET="digits",
                  XDG_CACHE_HOME=str(cache))
    assert json.loads(second.stdout)["memory"]["estimate"]["activations"] == (
        json.loads(first.stdout)["memory"]["estimate"]["activations"] + 1000)


def _plan(tmp_path: Path, gpus: list[GpuInfo], **settings: str) -> Any:
    runtime = runtime_of({"OUTPUT_DIR": str(tmp_path / "run"), **settings}, gpus)
    return plan_training(runtime, environ={})


def test_the_child_runs_on_gpus_and_in_a_dry_run_not_on_a_cpu_start(tmp_path: Path) -> None:
    asked: list[memprobe.MemoryRequest] = []

    def measure(request: memprobe.MemoryRequest, environ: Any) -> memprobe.Measured:
        asked.append(request)
        return canned_measure(request, environ)

    cpu = _plan(tmp_path, [], GPUS="none")
    start = memcheck.check_memory(cpu, _sizes(), dry_run=False, measure=measure)
    assert not asked and start.estimate is None
    assert start.lines == ("not estimated: on the CPU there is no device memory to compare "
                           "with (mgpu train --dry-run shows the estimate)",)
    shown = memcheck.check_memory(cpu, _sizes(), dry_run=True, measure=measure)
    assert len(asked) == 1 and shown.lines[0].startswith("memory per replica: about 897.2 KiB")
    gpus = _plan(tmp_path, [_gpu(0, 16_384), _gpu(1, 16_384)], BATCH_SIZE="32")
    on_gpus = memcheck.check_memory(gpus, _sizes(), dry_run=False, measure=measure)
    assert (asked[-1].model, asked[-1].input_shape, asked[-1].per_replica_batch) == (
        "mlp", (784,), 32)
    assert on_gpus.estimate is not None
    assert [line.split(":")[0] for line in on_gpus.lines[1:]] == ["GPU 0", "GPU 1"]
    # NVML that cannot say a GPU's memory gives nothing to compare with: as on the CPU.
    unknown = _plan(tmp_path, [_gpu(0, None)])
    said = memcheck.check_memory(unknown, _sizes(), dry_run=False, measure=measure).lines
    assert len(asked) == 2
    assert said == ("not estimated: NVML does not report the selected GPUs' memory to "
                    "compare with (mgpu train --dry-run shows the estimate)",)


def test_a_gpu_too_small_refuses_with_the_largest_batch(tmp_path: Path) -> None:
    plan = _plan(tmp_path, [_gpu(0, 1)])  # 1 MiB: the MLP's weights, slots and 17 samples
    estimate = canned_measure(mlp_request(), {}).estimate
    largest = estimate.largest_batch(MIB)
    assert largest == int((MIB * memory.USABLE_FRACTION - 4 * MLP_BYTES) // MLP_ACTIVATIONS)
    with pytest.raises(ConfigError) as caught:
        memcheck.check_memory(plan, _sizes(), dry_run=False, measure=canned_measure)
    assert str(caught.value) == memory.refusal(estimate, MIB, "GPU 0 (Tesla T4)")
    assert f"Fix: BATCH_SIZE={largest} or less" in str(caught.value)


REFUSED = """
import json, sys
from mgpu_env.hardware import nvml
from mgpu_env.runtime import record
from tests.support.fake_nvml import FakeGpu, fake_gpus

nvml.load_library = lambda: fake_gpus([FakeGpu(name="Tesla T4", memory_total=1 << 20,
                                               memory_free=1 << 20)])
record.nccl_available = lambda gpus: bool(gpus)
from entrypoint.app import app
try:
    app(["train"], prog_name="mgpu")
except SystemExit as stop:
    code = stop.code
print(json.dumps({"exit": code, "tensorflow": sorted(
    m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))}))
"""


@pytest.mark.slow
def test_mgpu_train_refuses_a_gpu_too_small_before_tensorflow_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=tmp_path, capture_output=True, text=True,
        env=child_env(tmp_path / "home", DATASET="digits", OUTPUT_DIR=str(tmp_path / "run")),
        timeout=300, check=False)
    found = json.loads(done.stdout.splitlines()[-1])
    estimate = canned_measure(mlp_request(), {}).estimate  # the real child's, as tested above
    assert found == {"exit": 2, "tensorflow": []}, done.stderr
    assert done.stderr == f"error: {memory.refusal(estimate, MIB, 'GPU 0 (Tesla T4)')}\n"
    assert "Fix: BATCH_SIZE=17 or less (the largest batch per replica that fits)" in done.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- the dry run


@pytest.mark.slow
def test_the_dry_run_shows_the_estimate(tmp_path: Path) -> None:
    shown = mgpu(tmp_path, "train", "--dry-run", GPUS="none", DATASET="digits")
    assert shown.returncode == 0, shown.stderr
    estimate = canned_measure(mlp_request(), {}).estimate
    line = memory.compare(estimate, "", [])[0].removeprefix("memory ")
    assert f"  memory         {line}\n" in shown.stdout
    assert "memory         per replica: about 897.2 KiB (weights 215.0 KiB" in shown.stdout
    as_json = mgpu(tmp_path, "train", "--dry-run", "--json", GPUS="none", DATASET="digits",
                   BATCH_SIZE="100")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["memory"]["estimate"] == {
        "per_replica_batch": 100, "weights": MLP_BYTES, "compute_copy": 0,
        "gradients": MLP_BYTES, "slots": 2 * MLP_BYTES, "activations": MLP_ACTIVATIONS * 100,
        "total": 4 * MLP_BYTES + MLP_ACTIVATIONS * 100}


# ----------------------------------------------------------------- the first step's peak


def test_the_first_peak_is_each_gpus_read_once() -> None:
    reads: list[str] = []

    def read(device: str) -> dict[str, int]:
        reads.append(device)
        if device == "GPU:1":
            raise ValueError("could not collect")
        return {"current": 1, "peak": 5 * MIB}

    devices = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(2)]
    peak = memcheck.FirstPeak(devices, read)
    peak(None)
    peak(None)  # after the first call: not read again
    assert peak.peaks == {"GPU:0": 5 * MIB} and reads == ["GPU:0", "GPU:1"]
    check = memcheck.MemoryCheck(canned_measure(mlp_request(), {}).estimate, ())
    record = memcheck.memory_record(check, peak)
    assert record["first_step_peak_bytes"] == {"GPU:0": 5 * MIB}
    assert memcheck.memory_result_line(record) == (
        "memory: estimated 897.2 KiB per replica; first step's peak GPU:0 5.0 MiB")


def test_on_the_cpu_the_peak_is_absent_not_read() -> None:
    def read(device: str) -> dict[str, int]:
        raise AssertionError("the CPU has no count to read")

    peak = memcheck.FirstPeak(["/job:localhost/replica:0/task:0/device:CPU:0"], read)
    peak(None)
    assert peak.peaks is None
    record = memcheck.memory_record(memcheck.MemoryCheck(None, ()), peak)
    assert record == {"estimate": None, "first_step_peak_bytes": None}
    assert memcheck.memory_result_line(record) is None  # the start summary said why
    estimated = {**record, "estimate": {"total": 3 * 2**20}}
    assert memcheck.memory_result_line(estimated) == (
        "memory: estimated 3.0 MiB per replica; no peak measured (TensorFlow counts GPU memory "
        "only)")


@pytest.mark.slow
def test_a_cpu_run_records_no_peak_and_no_estimate(tmp_path: Path) -> None:
    output = tmp_path / "run"
    done = train_process.run(output, EPOCHS="1")
    assert done.returncode == 0, done.stderr
    assert train_process.metrics(output)["memory"] == {"estimate": None,
                                                      "first_step_peak_bytes": None}
    assert ("  memory         not estimated: on the CPU there is no device memory to compare "
            "with (mgpu train --dry-run shows the estimate)\n") in done.stdout
    assert "  memory:" not in done.stdout  # no end line: nothing to set side by side


def test_the_start_summary_shows_each_gpus_share(
    use_fake_nvml: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from entrypoint import train as train_command
    from entrypoint.app import app
    from tests.support.fake_nvml import GIB, fake_with

    use_fake_nvml(fake_with(2))  # two 80 GiB GPUs
    monkeypatch.setattr(train_command, "_preflight", lambda runtime, wait: None)
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={
        "GPUS": "0,1", "DATASET": "digits", "OUTPUT_DIR": str(tmp_path / "run")})
    assert result.exit_code == 0, result.output
    estimate = canned_measure(mlp_request(), {}).estimate
    largest = estimate.largest_batch(80 * GIB)
    assert ("  memory         per replica: about 897.2 KiB (weights 215.0 KiB, gradients "
            "215.0 KiB, optimizer slots 430.1 KiB, activations 37.0 KiB at batch 64)\n"
            f"                 GPU 0: 0% of its 80.0 GiB; the largest batch per replica that "
            f"fits is about {largest:,}\n"
            f"                 GPU 1: 0% of its 80.0 GiB; the largest batch per replica that "
            f"fits is about {largest:,}\n") in result.stdout
