"""What a supervised run does after a failure: the stall's phase read from the watch's own
report, the next all-reduce over every request, phase and replica count, the GPUs kept at the
same global batch, the health check on the fake NVML (answering as pynvml does), and the
resume rule that lets the replicas change when the global batch is kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.exitcodes import EXIT_STALLED
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.recovery.decide import (
    ALL_REDUCE_ORDER,
    COLLECTIVE_PHASES,
    Kept,
    RunDevices,
    Stop,
    all_reduce_after,
    gpu_named,
    keep_devices,
    stalled_phase,
)
from mgpu_env.recovery.health import failing_gpus
from mgpu_env.recovery.supervise import OneRun, Recovering
from mgpu_env.runtime.cluster.attempts import Ended
from mgpu_env.training.multiworker.stallhints import FIRST_STEP, PHASES
from mgpu_env.training.run.rundir import identity_differences
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus

Install = Callable[[FakeNvml], FakeNvml]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("measured", ["", " (a call of steps took 0.02 s, median of 3)"])
def test_the_stalled_phase_is_read_from_the_watchs_report(phase: str, measured: str) -> None:
    report = [
        "Epoch 1/2",
        f"error: the run stalled: no progress for 4 s (STALL_TIMEOUT=4s) in {phase}{measured}.",
        "  Most likely: something.",
    ]
    assert stalled_phase(report) == phase


def test_a_run_that_did_not_stall_has_no_phase() -> None:
    assert stalled_phase(["error: UnknownError: boom", "Traceback"]) is None


@pytest.mark.parametrize("requested", ["auto", *ALL_REDUCE_ORDER])
@pytest.mark.parametrize("current", ALL_REDUCE_ORDER)
@pytest.mark.parametrize("phase", [*PHASES, None])
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_the_next_all_reduce_follows_the_order_only_for_auto_and_collectives(
    requested: str, current: str, phase: str | None, replicas: int
) -> None:
    after = all_reduce_after(requested, current, phase, replicas)
    moves = (requested == "auto" and replicas > 1 and phase in COLLECTIVE_PHASES
             and current != ALL_REDUCE_ORDER[-1])
    if moves:
        assert after == ALL_REDUCE_ORDER[ALL_REDUCE_ORDER.index(current) + 1]
    else:
        assert after is None


@pytest.mark.parametrize("gpus", [4, 3, 8])
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("global_batch", [12, 96, 256, 7])
@pytest.mark.parametrize("lost", [(), (0,), (1, 2)])
@pytest.mark.parametrize("min_gpus", [1, 2, 3])
def test_the_gpus_kept_are_the_most_healthy_ones_that_divide_the_global_batch(
    gpus: int, split: int, global_batch: int, lost: tuple[int, ...], min_gpus: int
) -> None:
    devices = RunDevices(tuple(range(gpus)), split, global_batch)
    decided = keep_devices(devices, {g: "lost" for g in lost}, min_gpus)
    healthy = [g for g in range(gpus) if g not in lost]
    dividing = [n for n in range(1, len(healthy) + 1) if global_batch % (n * split) == 0]
    best = max(dividing, default=0)
    if best < min_gpus:
        assert isinstance(decided, Stop)
        assert f"MIN_GPUS={min_gpus}" in decided.message and "Fix:" in decided.message
        return
    assert isinstance(decided, Kept)
    kept = decided.devices
    assert kept.gpus == tuple(healthy[:best])
    assert decided.idle == tuple(healthy[best:])
    assert set(decided.dropped) == set(lost)
    assert kept.global_batch == global_batch
    assert kept.replicas * int(kept.environment()["BATCH_SIZE"]) == global_batch


def test_four_gpus_with_one_lost_go_on_with_three_at_the_same_global_batch() -> None:
    kept = keep_devices(RunDevices((0, 1, 2, 3), 1, 12), {2: "lost"}, 1)
    assert isinstance(kept, Kept)
    assert kept.devices.environment() == {"GPUS": "0,1,3", "BATCH_SIZE": "4"}
    logical = RunDevices((0, 1, 2, 3), 1, 12, setting="VIRTUAL_DEVICES")
    kept = keep_devices(logical, {2: "lost"}, 1)
    assert isinstance(kept, Kept)
    assert kept.devices.environment() == {"VIRTUAL_DEVICES": "3", "BATCH_SIZE": "4"}


def test_the_gpu_an_error_names_is_counted_in_the_runs_gpus() -> None:
    lines = ["2026 W tensorflow: ... ",
             "error: InternalError: CUDA error on /job:localhost/replica:0/task:0/device:GPU:1"]
    assert gpu_named(lines, (0, 2, 5)) == 2
    assert gpu_named(["placed on device:GPU:1"], (0, 2, 5)) is None  # not an error
    assert gpu_named(["error on device:GPU:7"], (0, 2)) is None  # not one of the run's


@pytest.mark.parametrize(("gpu", "handle_error", "says"), [
    (FakeGpu(), 15, "NVML_ERROR_GPU_IS_LOST"),
    (FakeGpu(), 16, "NVML_ERROR_RESET_REQUIRED"),
    (FakeGpu(retired_pending=True), None, "Retired Pages: Pending Page Blacklist: Yes"),
    (FakeGpu(ecc_volatile=2), None, "Volatile Uncorrectable ECC errors: 2"),
    (FakeGpu(remapped=(0, 1, False, True)), None, "Remapping Failure Occurred"),
])
def test_the_doctors_health_check_chooses_the_gpu_to_leave_out(
    use_fake_nvml: Install, gpu: FakeGpu, handle_error: int | None, says: str
) -> None:
    errors = {2: handle_error} if handle_error is not None else {}
    use_fake_nvml(fake_gpus([FakeGpu(), FakeGpu(), gpu, FakeGpu()], handle_errors=errors))
    found = failing_gpus((0, 1, 2, 3))
    assert list(found) == [2] and says in found[2]
    assert failing_gpus((0, 1, 3)) == {}  # a GPU the run did not use is not its concern


def test_healthy_gpus_and_an_nvml_that_does_not_answer_leave_none_out(
    use_fake_nvml: Install
) -> None:
    # Warnings (a display, persistence off) slow a GPU down; they do not fail training.
    use_fake_nvml(fake_gpus([FakeGpu(), FakeGpu(display_active=True, persistence=False)]))
    assert failing_gpus((0, 1)) == {}
    use_fake_nvml(FakeNvml(init_error=9))  # NVML_ERROR_DRIVER_NOT_LOADED
    assert failing_gpus((0, 1)) == {}


def test_a_resume_may_change_the_replicas_when_the_global_batch_is_kept() -> None:
    before = {"global_batch_size": 12, "per_replica_batch_size": 3, "seed": 42}
    assert identity_differences(before, {**before, "per_replica_batch_size": 4}) == []
    other = identity_differences(before, {**before, "per_replica_batch_size": 4,
                                          "global_batch_size": 16})
    assert len(other) == 2 and any("BATCH_SIZE: 3 there, 4 now" in d for d in other)
    assert identity_differences(before, {**before, "seed": 1}) == ["SEED: 42 there, 1 now"]


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5", "2000"])
def test_a_bad_min_gpus_is_refused_with_what_is_valid(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_settings({"MIN_GPUS": text}, {})
    assert "MIN_GPUS" in str(raised.value) and "a whole number from 1 to 1024" in str(raised.value)


def _recovering(tmp_path: Any, gpus: tuple[int, ...], all_reduce: str, min_gpus: int = 1,
                global_batch: int = 12) -> tuple[Recovering, list[str]]:
    said: list[str] = []
    return Recovering(tmp_path, RunDevices(gpus, 1, global_batch), all_reduce, "auto",
                      min_gpus, say=said.append), said


STALL_REPORT = (f"error: the run stalled: no progress for 4 s (STALL_TIMEOUT=4s) in "
                f"{FIRST_STEP}.",)


def test_a_stall_in_the_first_step_on_nccl_restarts_with_hierarchical_copy(
    tmp_path: Any, use_fake_nvml: Install
) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(), FakeGpu()]))
    recovering, said = _recovering(tmp_path, (0, 1), "nccl")
    after = recovering(Ended(0, EXIT_STALLED, STALL_REPORT), OneRun())
    assert isinstance(after, OneRun) and after.env == {"CROSS_DEVICE_OPS": "hierarchical_copy"}
    assert "restarting with hierarchical_copy" in said[0]
    again = recovering(Ended(0, EXIT_STALLED, STALL_REPORT), after)
    assert isinstance(again, OneRun) and again.env["CROSS_DEVICE_OPS"] == "reduction_to_one"
    assert [e["to"] for e in recovering.events] == ["hierarchical_copy", "reduction_to_one"]
    assert recovering.end_lines()[0].startswith("recovered: all-reduce nccl -> hierarchical_copy")


def test_a_crash_with_a_lost_gpu_below_min_gpus_stops_saying_what_to_repair(
    tmp_path: Any, use_fake_nvml: Install
) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(), FakeGpu(ecc_volatile=1)]))
    recovering, said = _recovering(tmp_path, (0, 1), "nccl", min_gpus=2)
    assert recovering(Ended(0, 1, ("error: InternalError",)), OneRun()) is None
    assert "fewer than MIN_GPUS=2" in said[0] and "GPU 1: Volatile Uncorrectable" in said[0]
    recovering, said = _recovering(tmp_path, (0, 1), "nccl", min_gpus=1)
    after = recovering(Ended(0, 1, ("error: InternalError",)), OneRun())
    assert isinstance(after, OneRun) and after.env == {"GPUS": "0", "BATCH_SIZE": "12"}


def test_the_gpu_an_error_named_is_left_out_though_nvml_finds_it_healthy(
    tmp_path: Any, use_fake_nvml: Install
) -> None:
    use_fake_nvml(fake_gpus([FakeGpu() for _ in range(4)]))
    recovering, said = _recovering(tmp_path, (0, 1, 2, 3), "nccl")
    line = "error: InternalError: an illegal memory access on /device:GPU:3"
    after = recovering(Ended(0, 1, (line,)), OneRun())
    assert isinstance(after, OneRun)
    assert after.env == {"GPUS": "0,1,2", "BATCH_SIZE": "4"}
    assert "GPU 3 left out (the run's error named it)" in said[0]
