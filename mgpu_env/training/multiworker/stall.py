"""The stall watch of a run: a phase that overruns its bound is a stall, reported and ended.

Each phase has a bound; a stall is reported (the phase, each thread's Python stack, the last
lines on stderr, TensorFlow's and NCCL's C++ logs among them (`stderrtail`), what it most
likely means here and what to try) and ends the process with EXIT_STALLED.

It is `faults.Watchdog` (the between-workers watchdog) given a bound per phase and this
report: the same Python thread, and the same GIL-free backstop (faulthandler's C thread) for
a process stuck where Python cannot run, which BACKSTOP_GRACE_S later prints every thread's
stack with no GIL and exits 1.

Ending there saves nothing: the process ends as a kill -9 would, which leaves a checkpoint
being written unreferenced (the `checkpoint` index is replaced last, by rename) and every
other output (settings.json, history.json, metrics.json) written whole or not at all
(`rundir.atomic_write_json`).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mgpu_env.config.exitcodes import EXIT_STALLED
from mgpu_env.config.stalltime import StallTimeout
from mgpu_env.training.multiworker.faults import Watchdog
from mgpu_env.training.multiworker.stallhints import (
    FIRST_STEP,
    MODEL,
    SAVING,
    SCRIPT_CODE,
    STARTING,
    STEPS,
    STOPPING,
    STRATEGY,
    Devices,
    hint,
)
from mgpu_env.training.multiworker.stderrtail import StderrTail

# What a process that stalled exits with (1 is a failure, 2 a bad setting).
# STALL_TIMEOUT=auto's bounds. Floors where nothing was measured yet: TensorFlow's import
# and a data load, a GPU's set-up, the first step's trace and compile (XLA's can take
# minutes on a large model), a save to a slow disk. Steps: STEP_FACTOR times the median
# time of a call of steps once MEASURED_CALLS were timed, never under STEP_FLOOR_S (a
# retrace at an epoch's last, partial batch compiles again). A set STALL_TIMEOUT bounds every
# phase but the start-up, which keeps auto's: TensorFlow's import and a data load take what
# the machine's load makes them (over 120 s measured on a busy 2-core machine), not a hang.
AUTO_BOUNDS_S = {STARTING: 1800.0, STRATEGY: 600.0, MODEL: 900.0, FIRST_STEP: 1200.0,
                 SAVING: 1200.0}
AUTO_DEFAULT_S = 1200.0
PER_REPLICA_S = 60.0  # each replica past the first: more to set up and compile
STEP_FACTOR = 20.0
STEP_FLOOR_S = 600.0
MEASURED_CALLS = 3
# How often a phase's progress re-arms the backstop's timer (which then fires up to this
# much later): each re-arm starts a C thread, 0.25 ms measured, at every call of steps else.
REARM_S = 1.0
# The last lines of stderr kept for the report, and of TensorFlow's Python log records.
LOG_LINES = 30


class _Recent(logging.Handler):
    """The last LOG_LINES records of TensorFlow's Python logger."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname[0]} {record.getMessage()}")


def stacks(skip: int | None = None) -> str:
    """Each Python thread's stack, the main thread first (thread `skip` left out)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sorted(sys._current_frames().items(),
                    key=lambda item: item[0] != threading.main_thread().ident)
    parts = []
    for ident, frame in frames:
        if ident == skip:
            continue
        stack = "".join(traceback.format_stack(frame)).rstrip()
        parts.append(f"Thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)


def stop_stalled(report: str, fd: int = 2, tag: str = "") -> None:
    """Write the report to `fd` (stderr), each line after `tag` (a worker's "[worker 1] "),
    and end the process now with EXIT_STALLED (`os._exit`: the main thread is blocked where
    no exception reaches)."""
    data = "".join(f"{tag}{line}\n" for line in f"error: {report}".splitlines()).encode(
        errors="replace")
    while data:
        data = data[os.write(fd, data):]
    os._exit(EXIT_STALLED)


@dataclass(frozen=True)
class Among:
    """A worker of several, as its stall watch names it and waits on the others: `who`
    ("worker 1") and `tag` ("[worker 1] ") name it in the report and its lines; `peers`
    (name -> address) are the other workers, whom the GIL-free backstop asks whether they
    listen (`backstop.Backstop`); `worker_timeout_s` (WORKER_TIMEOUT) caps every phase after
    the start: each waits on the other workers too."""

    who: str = ""
    tag: str = ""
    peers: Mapping[str, str] | None = None
    worker_timeout_s: float | None = None


@dataclass(frozen=True)
class Watched:
    """The run a stall watch watches, as its report tells of it: its devices (the hints
    read them), what was saved and how to go on (`saved`; `resumes_with` for `mgpu
    train`'s), and the worker of several it is (`among`; None for one process)."""

    devices: Devices
    saved: str
    among: Among | None = None


def resumes_with(resume: str) -> str:
    """`mgpu train`'s words on what a stall leaves: how to start again (`resume`)."""
    return ("Nothing was half-written: a checkpoint being saved stays unreferenced, and "
            "starting again with the same OUTPUT_DIR resumes from the last complete one "
            f"(or starts afresh if there is none): {resume}")


class StallWatch:
    """The phases of one run, each bounded; `phase(name)` starts one, `call_done()` marks a
    call of steps completed (the first one ends the first step), `stop()` disarms. With
    STALL_TIMEOUT=0 every method does nothing.

    Made before TensorFlow's quiet import: that sends fd 2 elsewhere while it runs, so the
    report and the backstop's dump go to a copy of stderr taken here. From the first phase
    to `stop()` fd 2 is a pipe whose helper copies it there and keeps its last lines
    (`StderrTail`); the quiet import's own lines are held back from it, as from the user.

    `run`: what the report says of the run watched (`Watched`).
    """

    def __init__(self, timeout: StallTimeout, run: Watched,
                 on_stall: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.devices = run.devices
        self._saved = run.saved
        among = run.among or Among()
        who, tag, peers = among.who, among.tag, among.peers
        self._who = who
        self._tag = tag
        self._cap_s = among.worker_timeout_s
        self._clock = clock
        self._calls: collections.deque[float] = collections.deque(maxlen=101)
        self._last: float | None = None
        self._phase = ""
        self._log = _Recent()
        self._dog: Watchdog | None = None
        self._started = False
        self._stderr: int | None = None
        self._tail: StderrTail | None = None
        self._tail_error = ""
        if not timeout.off:
            self._stderr = os.dup(2)
            first = self.bound(STARTING)
            self._dog = Watchdog(
                first, who or "this run",
                on_stall or functools.partial(stop_stalled, fd=self._stderr, tag=tag),
                clock=clock, poll_s=min(1.0, (timeout.seconds or first) / 10),
                explain=self._report, dump_fd=self._stderr, rearm_s=REARM_S,
                peers=peers, tag=tag)

    @property
    def current(self) -> str:
        """The phase now ("" before the first)."""
        return self._phase

    def bound(self, phase: str) -> float:
        """How long `phase` may go without progress (`math.inf`: no bound)."""
        return self._bounded(phase)[0]

    def _bounded(self, phase: str) -> tuple[float, str]:
        """`phase`'s bound and the setting that set it: "WORKER_TIMEOUT", or STALL_TIMEOUT
        as set ("STALL_TIMEOUT=4s", "STALL_TIMEOUT=auto"), which the report and the
        backstop's message name."""
        own = self._own_bound(phase)
        if self._cap_s is not None and phase in (STRATEGY, STOPPING):
            # The wait for the others to start, or to end: theirs.
            return self._cap_s, "WORKER_TIMEOUT"
        if self._cap_s is not None and phase != STARTING and self._cap_s < own:
            return self._cap_s, "WORKER_TIMEOUT"
        return own, "STALL_TIMEOUT=auto" if self.timeout.auto else f"STALL_TIMEOUT={self.timeout}"

    def _own_bound(self, phase: str) -> float:
        if phase == SCRIPT_CODE:
            return math.inf
        if self.timeout.seconds is not None and phase != STARTING:
            return self.timeout.seconds
        extra = PER_REPLICA_S * (self.devices.replicas - 1)
        if phase == STEPS and len(self._calls) >= MEASURED_CALLS:
            return max(STEP_FLOOR_S, STEP_FACTOR * statistics.median(self._calls)) + extra
        return AUTO_BOUNDS_S.get(phase, AUTO_DEFAULT_S) + extra

    def phase(self, name: str) -> None:
        if self._dog is None:
            return
        if not self._phase:
            logging.getLogger("tensorflow").addHandler(self._log)
        self._phase = name
        self._last = None
        if not self._started:
            self._started = True
            self._start_tail()
            self._dog.start(name)
        self._dog.progress(name, *self._bounded(name))

    def _start_tail(self) -> None:
        assert self._stderr is not None
        try:
            self._tail = StderrTail(self._stderr, LOG_LINES)
        except OSError as err:
            # The run goes on watched; its report says why it has no stderr lines.
            self._tail_error = f"the helper that keeps them did not start: {err}"

    def call_done(self) -> None:
        """A call of steps ended: the first ends the first step; the others are timed."""
        if self._dog is None:
            return
        now = self._clock()
        if self._phase == STEPS and self._last is not None:
            self._calls.append(now - self._last)
        self._phase, self._last = STEPS, now
        self._dog.progress(STEPS, *self._bounded(STEPS))

    def stop(self) -> None:
        if self._dog is not None:
            self._dog.stop()
            logging.getLogger("tensorflow").removeHandler(self._log)
            self._dog = None
        if self._tail is not None:
            self._tail.stop()
            self._tail = None
        if self._stderr is not None:
            os.close(self._stderr)
            self._stderr = None

    def _logs(self) -> str:
        """The report's last lines: stderr's (a worker's tag taken off its own: the report's
        lines get it again), then TensorFlow's Python records it lacks (a logging set-up
        that sends them elsewhere)."""
        lines = self._tail.lines() if self._tail is not None else None
        if lines is None:
            why = self._tail_error or "its helper did not answer"
            shown = f"The last lines on stderr: not kept ({why}).\n"
            lines = []
        else:
            shown = ("The last lines on stderr (TensorFlow's and NCCL's C++ logs among them; "
                     "NCCL_DEBUG=INFO adds NCCL's):\n"
                     + ("\n".join(f"  {line.removeprefix(self._tag)}"
                                  for line in lines) or "  (none)") + "\n")
        elsewhere = [record for record in self._log.lines
                     if not any(record[2:] in line for line in lines)]
        if elsewhere:
            shown += "TensorFlow's last Python log records, not on stderr:\n" + "\n".join(
                f"  {record}" for record in elsewhere) + "\n"
        return shown

    def _report(self, phase: str, bound_s: float) -> str:
        meaning, fix = hint(phase, self.devices)
        how = self._bounded(phase)[1]
        if how == "WORKER_TIMEOUT":
            how = f"WORKER_TIMEOUT={bound_s:g}: how long a worker waits for the others"
        elif self.timeout.auto:
            how = "STALL_TIMEOUT=auto's bound for this phase"
        measured = (f" (a call of steps took {statistics.median(self._calls):.3g} s, median "
                    f"of {len(self._calls)})" if phase == STEPS and self._calls else "")
        who = f"{self._who}: " if self._who else ""
        return (
            f"{who}the run stalled: no progress for {bound_s:g} s ({how}) in {phase}{measured}.\n"
            f"  Most likely: {meaning}.\n"
            f"  Try: {fix}.\n"
            f"  {self._saved}\n"
            f"  STALL_TIMEOUT sets the bound (0: off).\n"
            f"{self._logs()}"
            f"Each thread's Python stack (most recent call last):\n"
            f"{stacks(skip=threading.get_ident())}"
        )
