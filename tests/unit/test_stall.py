"""The stall watch of a single-process run without TensorFlow: STALL_TIMEOUT's values, each
phase's bound (auto: floors, then the measured call time), the hints per phase and device,
and a real stall of a real thread reported with its phase and every thread's stack."""

from __future__ import annotations

import ctypes
import logging
import threading
import time

import pytest

from mgpu_env.config.stalltime import StallTimeout, parse_stall_timeout
from mgpu_env.config.text import SettingError
from mgpu_env.training.multiworker import stall
from mgpu_env.training.multiworker.stallhints import (
    EVALUATING,
    FIRST_STEP,
    MODEL,
    PHASES,
    SAVING,
    SCRIPT_CODE,
    STARTING,
    STEPS,
    STRATEGY,
    Devices,
    hint,
)

ONE_CPU = Devices(1, "CPU", "none", {})
FOUR_GPUS = Devices(4, "GPU", "nccl", {})


@pytest.mark.parametrize(("text", "seconds"), [
    ("auto", None), (" AUTO ", None), ("0", 0.0), ("off", 0.0), ("600", 600.0),
    ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("1", 1.0), ("168h", 604800.0), ("5 m", 300.0),
])
def test_stall_timeout_reads_auto_off_and_times(text: str, seconds: float | None) -> None:
    value = parse_stall_timeout(text)
    assert value.seconds == seconds
    assert parse_stall_timeout(str(value)) == value


@pytest.mark.parametrize("text", ["", "-5", "0.5", "0.5s", "169h", "never", "10d", "nan",
                                  "inf", "1e999", "\u0663", "auto5"])
def test_stall_timeout_refuses_the_rest(text: str) -> None:
    with pytest.raises(SettingError):
        parse_stall_timeout(text)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch(timeout: StallTimeout, devices: Devices = ONE_CPU,
          clock: Clock | None = None) -> stall.StallWatch:
    return stall.StallWatch(timeout, stall.Watched(devices, stall.resumes_with(
        "OUTPUT_DIR=x mgpu train")), on_stall=lambda report: None, clock=clock or Clock())


def test_auto_bounds_a_phase_by_its_floor_then_steps_by_their_measured_time() -> None:
    clock = Clock()
    auto = watch(StallTimeout(), clock=clock)
    try:
        for phase in (STARTING, STRATEGY, MODEL, FIRST_STEP, SAVING):
            assert auto.bound(phase) == stall.AUTO_BOUNDS_S[phase]
        auto.phase(FIRST_STEP)
        clock.now = 500.0
        auto.call_done()  # the first step's end: its compile is not a step's time
        assert auto.bound(STEPS) == stall.AUTO_DEFAULT_S
        for seconds in (40.0, 50.0, 60.0):
            clock.now += seconds
            auto.call_done()
        assert auto.bound(STEPS) == max(stall.STEP_FLOOR_S, stall.STEP_FACTOR * 50.0)
        assert auto.bound(STEPS) == 1000.0
    finally:
        auto.stop()


def test_auto_gives_more_replicas_more_time_and_a_set_time_bounds_every_phase() -> None:
    four = watch(StallTimeout(), FOUR_GPUS)
    assert four.bound(FIRST_STEP) == stall.AUTO_BOUNDS_S[FIRST_STEP] + 3 * stall.PER_REPLICA_S
    fixed = watch(StallTimeout(7.0), FOUR_GPUS)
    assert {fixed.bound(phase) for phase in PHASES if phase != STARTING} == {7.0}
    assert fixed.bound(STARTING) == stall.AUTO_BOUNDS_S[STARTING] + 3 * stall.PER_REPLICA_S
    four.stop()
    fixed.stop()


def test_off_watches_nothing() -> None:
    before = threading.active_count()
    off = watch(StallTimeout(0.0))
    off.phase(STARTING)
    off.call_done()
    assert threading.active_count() == before
    off.stop()


def test_the_hints_name_nccls_fixes_for_a_stall_of_several_gpus() -> None:
    meaning, fix = hint(FIRST_STEP, FOUR_GPUS)
    assert "NCCL" in meaning and "tensorflow#60363" in meaning
    assert "CROSS_DEVICE_OPS=hierarchical_copy" in fix and "NCCL_P2P_DISABLE=1" in fix
    meaning, _ = hint(STEPS, Devices(4, "GPU", "nccl", {"NCCL_P2P_DISABLE": "1"}))
    assert "NCCL_P2P_DISABLE='1' was already set" in meaning
    meaning, _ = hint(STEPS, ONE_CPU)
    assert "no collective" in meaning
    meaning, fix = hint(FIRST_STEP, Devices(2, "CPU", "reduction_to_one", {}))
    assert "reduction_to_one" in meaning and "NCCL" not in meaning + fix
    # Every phase has its own words.
    assert len({hint(phase, ONE_CPU)[0] for phase in PHASES}) == len(PHASES)
    assert "disk" in hint(SAVING, ONE_CPU)[0] and "evaluation" in hint(EVALUATING, ONE_CPU)[0]


def test_a_real_stall_is_reported_with_its_phase_and_every_threads_stack() -> None:
    reports: list[str] = []
    done = threading.Event()

    def on_stall(report: str) -> None:
        reports.append(report)
        done.set()

    blocked = threading.Event()

    def stuck_in_a_step() -> None:
        blocked.wait(30)

    worker = threading.Thread(target=stuck_in_a_step, name="stepper", daemon=True)
    one = stall.StallWatch(StallTimeout(1.0), stall.Watched(
        FOUR_GPUS, stall.resumes_with("OUTPUT_DIR=x mgpu train")), on_stall=on_stall)
    try:
        one.phase(FIRST_STEP)
        started = time.monotonic()
        worker.start()
        assert done.wait(10), "no report"
        took = time.monotonic() - started
    finally:
        blocked.set()
        one.stop()
    assert 1.0 <= took < 2.5, took
    report = reports[0]
    assert report.startswith("the run stalled: no progress for 1 s (STALL_TIMEOUT=1s) in "
                             f"{FIRST_STEP}.")
    assert "NCCL_P2P_DISABLE=1" in report and "OUTPUT_DIR=x mgpu train" in report
    assert "Thread stepper:" in report and "in stuck_in_a_step" in report
    assert "Thread MainThread:" in report and "mgpu-watchdog" not in report


def test_a_scripts_own_code_is_unbounded_and_the_next_phase_bounds_again() -> None:
    """`mgpu run`: the script's own code (its data's load, its work after training) is
    never a stall; the next phase the watch sees is bounded from its own start."""
    reports: list[str] = []
    one = stall.StallWatch(StallTimeout(1.0), stall.Watched(
        ONE_CPU, "the script's checkpoints are its own", stall.Among("worker 1")),
        on_stall=reports.append)
    try:
        one.phase(SCRIPT_CODE)
        assert one.bound(SCRIPT_CODE) == float("inf")
        time.sleep(1.6)
        assert not reports
        one.phase(STRATEGY)
        started = time.monotonic()
        while not reports and time.monotonic() - started < 10:
            time.sleep(0.05)
        took = time.monotonic() - started
    finally:
        one.stop()
    assert 1.0 <= took < 2.5, took
    assert reports[0].startswith(f"worker 1: the run stalled: no progress for 1 s "
                                 f"(STALL_TIMEOUT=1s) in {STRATEGY}.")
    assert "the script's checkpoints are its own" in reports[0]


def test_a_workers_bounds_are_capped_by_worker_timeout_and_its_join_is_worker_timeouts() -> None:
    two = Devices(2, "CPU", "ring", {}, workers=2)
    worker = stall.Watched(two, stall.resumes_with(""), stall.Among(worker_timeout_s=300.0))
    auto = stall.StallWatch(StallTimeout(), worker, on_stall=lambda report: None)
    short = stall.StallWatch(StallTimeout(4.0), worker, on_stall=lambda report: None)
    try:
        # The join waits for the others' start: WORKER_TIMEOUT's, whatever STALL_TIMEOUT.
        assert auto.bound(STRATEGY) == short.bound(STRATEGY) == 300.0
        assert auto.bound(FIRST_STEP) == 300.0 and short.bound(FIRST_STEP) == 4.0
        assert short.bound(STARTING) == stall.AUTO_BOUNDS_S[STARTING] + stall.PER_REPLICA_S
        report = auto._report(FIRST_STEP, 300.0)
        assert "(WORKER_TIMEOUT=300: how long a worker waits for the others)" in report
        assert "the all-reduce between the 2 workers (2 replicas) never completed" in report
        assert "(STALL_TIMEOUT=4s)" in short._report(FIRST_STEP, 4.0)
    finally:
        auto.stop()
        short.stop()
    meaning, fix = hint(STRATEGY, two)
    assert "did not all join" in meaning and "WORKER_HOSTS" in fix


def test_the_backstop_calls_a_stuck_strategy_build_a_join() -> None:
    """Between workers the stall watch's phase of the strategy's build is the join: the
    backstop helper (stdlib only, so it matches the words) says so."""
    from mgpu_env.training.multiworker.backstop import stuck_message

    message = stuck_message("worker 0 (h:1)", STRATEGY, 16.2, 10, 5, {"worker 1": "h:2"},
                            {"worker 1": "nothing listens there"})
    assert message.startswith("worker 0 (h:1) waited 16 s for the other workers to join: "
                              "worker 1 (h:2): nothing listens there.")


def test_a_report_ends_with_the_last_lines_written_to_stderr_from_c_too(
        capfd: pytest.CaptureFixture[str]) -> None:
    """What C writes to fd 2 (as TensorFlow's and NCCL's logs are written) is in the
    report's last lines and on stderr as before (a worker's own lines without its tag, which
    the report's lines get again); a TensorFlow Python record that stderr never saw is
    shown apart."""
    reports: list[str] = []
    done = threading.Event()

    def on_stall(report: str) -> None:
        reports.append(report)
        done.set()

    libc = ctypes.CDLL(None)
    one = stall.StallWatch(StallTimeout(1.0), stall.Watched(
        ONE_CPU, "nothing saved", stall.Among("worker 1", "[worker 1] ")), on_stall=on_stall)
    written = [f"NCCL INFO line {i}\n" for i in range(stall.LOG_LINES + 5)] + [
        "[worker 1] a line of its own\n"]
    try:
        one.phase(FIRST_STEP)
        for line in written:
            libc.write(2, line.encode(), len(line))
        # The watch's handler is the logger's only one (no TensorFlow here to add its
        # own): the record reaches no stream.
        logging.getLogger("tensorflow").warning("a Python record")
        assert done.wait(10), "no report"
    finally:
        one.stop()
    report = reports[0]
    kept = [f"  NCCL INFO line {i}" for i in range(6, stall.LOG_LINES + 5)] + [
        "  a line of its own"]
    assert ("The last lines on stderr (TensorFlow's and NCCL's C++ logs among them; "
            "NCCL_DEBUG=INFO adds NCCL's):\n" + "\n".join(kept) + "\n"
            "TensorFlow's last Python log records, not on stderr:\n  W a Python record\n"
            "Each thread's Python stack") in report
    assert capfd.readouterr().err == "".join(written)


def test_the_backstop_names_the_setting_that_bounded_the_phase() -> None:
    """A worker's phase bounded by STALL_TIMEOUT (under WORKER_TIMEOUT) is named so in the
    GIL-free backstop's message, not as WORKER_TIMEOUT."""
    from mgpu_env.training.multiworker.backstop import stuck_message

    two = Devices(2, "CPU", "ring", {}, workers=2)
    worker = stall.Watched(two, stall.resumes_with(""), stall.Among(worker_timeout_s=300.0))
    short = stall.StallWatch(StallTimeout(4.0), worker, on_stall=lambda report: None)
    auto = stall.StallWatch(StallTimeout(), worker, on_stall=lambda report: None)
    try:
        assert short._bounded(FIRST_STEP) == (4.0, "STALL_TIMEOUT=4s")
        assert short._bounded(STRATEGY) == auto._bounded(FIRST_STEP) == (300.0, "WORKER_TIMEOUT")
        assert auto._bounded(STARTING)[1] == "STALL_TIMEOUT=auto"
    finally:
        short.stop()
        auto.stop()
    message = stuck_message("worker 0 (h:1)", FIRST_STEP, 9.6, 4, 5, {"worker 1": "h:2"},
                            {"worker 1": "listening"}, "STALL_TIMEOUT=4s")
    assert message.endswith("STALL_TIMEOUT=4s bounded this phase at 4 s (then 5 s of grace); "
                            "WORKER_TIMEOUT caps it for a worker.")
    assert "WORKER_TIMEOUT=" not in message
