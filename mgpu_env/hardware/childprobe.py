"""The protocol every probe child follows, written once.

Start a Python child with an environment, stop it (and every helper it started) after a
timeout, find its answer (the last stdout line that starts with the probe's marker, JSON after
it), and keep stderr (its tail names the reason when there is no answer; TensorFlow's log is on
it).

Used by `tfprobe` (TensorFlow's build and GPUs), `cudalibs` (the CUDA libraries),
`cudadriver` (cuInit) and the doctor's smoke job, which also watches the phases the child
announces on stderr (`PhaseWatch`): a phase between devices without progress is a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mgpu_env.hardware import signals


@dataclass(frozen=True)
class PhaseWatch:
    """Phases the child announces on stderr (`marker` + the phase's name); a phase whose
    name starts with one of `watched` may last at most `timeout_s` without a new one."""

    marker: str
    timeout_s: float
    watched: tuple[str, ...]


@dataclass(frozen=True)
class ChildAnswer:
    """What a probe child gave back. `answer`: the text after the marker (None: no such
    line); `start_error`: why it could not start; `timed_out`: stopped at the timeout;
    `hung_in`: the phase it was stopped in (with `PhaseWatch`)."""

    answer: str | None
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    start_error: str | None = None
    timed_out: bool = False
    hung_in: str | None = None
    seconds: float = 0.0

    def tail(self, lines: int = 3) -> str:
        """stderr's last lines, joined: what a child that gave no answer said last."""
        return " | ".join(self.stderr.strip().splitlines()[-lines:]) or "no output"

    def exited(self, what: str, lines: int = 3) -> str:
        """`<what> exited with code N: <stderr's tail>`, or, for a child a signal ended,
        `<what> was killed by SIGILL: <what that means here>; its last words: <tail>`."""
        died = signals.describe(self.returncode) if self.returncode is not None else None
        if died is not None:
            return f"{what} was {died}; its last words: {self.tail(lines)}"
        return f"{what} exited with code {self.returncode}: {self.tail(lines)}"

    def no_answer(self, what: str, timeout_s: float) -> str | None:
        """Why `what` gave no answer (it could not start, it hung, it exited without the
        marker's line), or None when it answered."""
        if self.start_error is not None:
            return self.start_error
        if self.timed_out:
            return f"{what} did not answer within {timeout_s:g} s"
        return self.exited(what) if self.answer is None else None


def _kill_group(process: subprocess.Popen[str]) -> None:
    # The child may have started helpers of its own (TensorFlow's compilers); its session
    # holds them all, and nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _read(process: subprocess.Popen[str], phases: PhaseWatch | None
          ) -> tuple[list[str], list[str], dict[str, object], list[threading.Thread]]:
    out: list[str] = []
    err: list[str] = []
    state: dict[str, object] = {"phase": "", "since": time.monotonic()}

    def read_err() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            err.append(line)
            if phases is not None and line.startswith(phases.marker):
                state.update(phase=line[len(phases.marker):].strip(), since=time.monotonic())

    def read_out() -> None:
        assert process.stdout is not None
        out.append(process.stdout.read())

    readers = [threading.Thread(target=read_err, daemon=True),
               threading.Thread(target=read_out, daemon=True)]
    for reader in readers:
        reader.start()
    return out, err, state, readers


def _answer(stdout: str, marker: str) -> str | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker):
            return line.removeprefix(marker)
    return None


def ask(
    argv: Sequence[str], environ: Mapping[str, str], *, marker: str, timeout_s: float,
    phases: PhaseWatch | None = None,
) -> ChildAnswer:
    """Run the child `argv` with `environ`; never raises."""
    start = time.monotonic()
    try:
        process = subprocess.Popen(list(argv), env=dict(environ), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as error:
        return ChildAnswer(None, start_error=f"could not start Python: {error}")
    out, err, state, readers = _read(process, phases)
    hung: str | None = None
    while process.poll() is None:
        now = time.monotonic()
        watched = phases is not None and str(state["phase"]).startswith(phases.watched)
        stalled = watched and phases is not None and \
            now - float(state["since"]) > phases.timeout_s  # type: ignore[arg-type]
        if now - start > timeout_s or stalled:
            hung = str(state["phase"]) or "start"
            _kill_group(process)
            break
        time.sleep(0.01)
    process.wait()
    for reader in readers:
        reader.join(timeout=5)
    stdout, stderr = "".join(out), "".join(err)
    return ChildAnswer(None if hung is not None else _answer(stdout, marker), stdout, stderr,
                    process.returncode, timed_out=hung is not None,
                    hung_in=hung if phases is not None else None,
                    seconds=time.monotonic() - start)
