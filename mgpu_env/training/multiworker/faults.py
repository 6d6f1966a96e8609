"""When a worker dies or hangs: what our code does about it.

It recognises TensorFlow's errors for it, and holds the watchdog that bounds the waits
TensorFlow does not."""

from __future__ import annotations

import faulthandler
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping

from mgpu_env.config.exitcodes import EXIT_FAILED
from mgpu_env.training.multiworker.backstop import WORKER_TIMEOUT, Backstop

# What a worker that hits the watchdog exits with (RunFailed's code).
EXIT_WORKER_LOST = EXIT_FAILED
# How long after the watchdog's deadline the GIL-free backstop ends a process that the
# watchdog's own thread could not (see Watchdog).
BACKSTOP_GRACE_S = 5.0


# ------------------------------------------------------------------------------- faults

_FAILURE_MARKERS = (
    "unhealthy",
    "stopped sending heartbeats",
    "Collective ops is aborted",
    "Connection reset by peer",
    "Socket closed",
    "failed to connect",
    "connection refused",
    "cluster check alive failed",
    "coordination service",
)


def is_worker_failure(err: BaseException) -> bool:
    """Whether a TensorFlow error means another worker died or became unreachable."""
    name = type(err).__name__
    text = str(err)
    if name not in (
        "UnavailableError", "AbortedError", "DeadlineExceededError", "InternalError",
        "CancelledError", "FailedPreconditionError", "UnknownError",
    ):
        return False
    return any(marker.lower() in text.lower() for marker in _FAILURE_MARKERS)


_TASK_RE = re.compile(r"/job:(chief|worker)/(?:replica:\d+/)?task:(\d+)")


def lost_tasks(text: str, me: tuple[str, int] | None = None) -> list[str]:
    """The other tasks a TensorFlow error names ("worker 1"), in order of appearance."""
    found: list[str] = []
    for job, index in _TASK_RE.findall(text):
        if me is not None and (job, int(index)) == me:
            continue
        name = f"{job} {index}"
        if name not in found:
            found.append(name)
    return found


def explain_worker_failure(err: BaseException, who: str, me: tuple[str, int] | None = None) -> str:
    """One readable message for a lost worker, with TensorFlow's most telling line."""
    text = str(err)
    lines = [re.sub(r"\{\{[^}]*\}\}\s*", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    telling = next(
        (
            line for line in lines
            if any(m.lower() in line.lower() for m in ("unhealthy", "aborted by", "reset by"))
        ),
        lines[0] if lines else type(err).__name__,
    )
    lost = lost_tasks(text, me)
    subject = f"{lost[0]} stopped or cannot be reached" if lost else (
        "another worker stopped or cannot be reached"
    )
    return (
        f"{subject[0].upper()}{subject[1:]}, so {who} stops too.\n"
        f"  TensorFlow: {telling}\n"
        "  Completed epochs are in the chief's checkpoints: start every worker again "
        "(same settings) to resume."
    )


def abort_process(message: str, tag: str = "") -> None:
    """Print `message` to stderr (each line after `tag`, "[worker 1] ") and end the process
    now (the watchdog's default action).

    `os._exit`, not `sys.exit`: the main thread may be blocked inside a collective that no
    exception can reach, and interpreter shutdown could wait on it.
    """
    sys.stderr.write("".join(f"{tag}{line}\n" for line in f"error: {message}".splitlines()))
    sys.stderr.flush()
    os._exit(EXIT_WORKER_LOST)


class Watchdog:
    """Ends the run when no progress is reported for `timeout_s` seconds.

    `start(phase)` arms it; `progress(phase)` pushes the deadline back (call it after every
    completed call of the feed's runner, save and evaluation); `stop()` disarms it. On expiry a
    Python thread calls `on_expire` with a message naming the phase, once.

    That thread needs the GIL, and one wait holds it: MultiWorkerMirroredStrategy's
    constructor, waiting for the other workers to join, blocks in C++ without releasing
    it (measured with TF 2.21: the thread never ran; so does SIGTERM's handler, and the
    coordination service's `cluster_register_timeout` did not end the wait either). So
    `backstop` also arms `faulthandler.dump_traceback_later`, whose C thread needs no GIL:
    BACKSTOP_GRACE_S after the deadline it exits 1. With `peers`, its "Timeout" dump and
    stacks go to a helper process (`backstop.Backstop`), which prints instead which of them
    (name -> address) do not answer, each line after `tag`; without, the dump itself (every
    thread's stack, written with no GIL) goes to stderr.

    `progress(phase, bound_s, setting)` may give a phase its own bound (the stall watch's
    phases; `math.inf`: none, the backstop's timer cancelled) and name the setting that set
    it ("STALL_TIMEOUT=4s"; WORKER_TIMEOUT until one is named) for the helper's message;
    `explain(phase, bound_s)` writes the message on expiry (default: a lost worker's);
    `dump_fd`: where the backstop's dump goes without peers (default: stderr). Re-arming
    faulthandler's timer starts a C thread (about 0.2 ms); `rearm_s` re-arms it only that
    often in one phase, and so sets it that much later.
    """

    def __init__(
        self,
        timeout_s: float,
        who: str,
        on_expire: Callable[[str], None] = abort_process,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float | None = None,
        backstop: bool = True,
        peers: Mapping[str, str] | None = None,
        tag: str = "",
        explain: Callable[[str, float], str] | None = None,
        dump_fd: int | None = None,
        rearm_s: float = 0.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._bound_s = timeout_s
        self._setting = WORKER_TIMEOUT
        self._explain = explain or self._lost_worker
        self._dump_fd = dump_fd
        self._rearm_s = rearm_s
        self._armed: tuple[float, float] | None = None  # (when, bound) of the backstop's timer
        self.who = who
        self._on_expire = on_expire
        self._clock = clock
        self._poll_s = poll_s if poll_s is not None else min(1.0, timeout_s / 10)
        self._lock = threading.Lock()
        self._phase = ""
        self._deadline = float("inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop = backstop
        self._peers = dict(peers or {})
        self._tag = tag
        self._helper: Backstop | None = None
        self.expired = False

    def start(self, phase: str) -> None:
        self.progress(phase)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="mgpu-watchdog", daemon=True)
            self._thread.start()

    def progress(self, phase: str | None = None, bound_s: float | None = None,
                 setting: str | None = None) -> None:
        with self._lock:
            if phase is not None:
                self._phase = phase
            if bound_s is not None:
                self._bound_s = bound_s
            if setting is not None:
                self._setting = setting
            self._deadline = self._clock() + self._bound_s
            now = time.monotonic()
            due = (self._armed is None or self._armed[1] != self._bound_s
                   or now - self._armed[0] >= self._rearm_s)
            if due:
                self._armed = (now, self._bound_s)
        if self._backstop and not self._stop.is_set() and due and math.isinf(self._bound_s):
            faulthandler.cancel_dump_traceback_later()  # a phase with no bound
        elif self._backstop and not self._stop.is_set() and due:
            helper = self._backstop_helper() if self._peers else None
            faulthandler.dump_traceback_later(
                self._bound_s + BACKSTOP_GRACE_S + self._rearm_s, repeat=False,
                file=helper.dump_fd if helper is not None else (
                    sys.stderr if self._dump_fd is None else self._dump_fd),
                exit=True,
            )
            if helper is not None:
                helper.progress(self._phase, self._bound_s, self._setting)

    def _backstop_helper(self) -> Backstop | None:
        """The helper that puts the backstop's dump in words, started once; None (the
        raw dump then) where it cannot start."""
        if self._helper is None:
            try:
                self._helper = Backstop(self.who, self.timeout_s, BACKSTOP_GRACE_S,
                                        self._peers, self._tag)
            except OSError:
                return None
        return self._helper

    def stop(self) -> None:
        self._stop.set()
        self._armed = None
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
            if self._helper is not None:
                self._helper.close()
                self._helper = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._lock:
                late = self._clock() > self._deadline
                phase = self._phase
            if late:
                self.expired = True
                self._on_expire(self._explain(phase, self._bound_s))
                return

    def _lost_worker(self, phase: str, bound_s: float) -> str:
        return (
            f"{self.who}: no progress for {bound_s:g} s while {phase}; another "
            "worker is probably down, stuck or unreachable.\n  Check every worker's "
            "log; start them all again to resume from the last completed epoch "
            "(WORKER_TIMEOUT sets this limit)."
        )

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def reclaim_signal_handlers() -> None:
    """Install Python's SIGTERM and SIGINT handlers again, over any C library's."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(signum)
        if handler is None:
            continue  # set outside Python: leave it
        try:
            signal.signal(signum, handler)
        except ValueError:
            return  # not the main thread: Python cannot install handlers here


