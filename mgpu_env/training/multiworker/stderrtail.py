"""The last lines this process writes to file descriptor 2, C++ included.

TensorFlow's and NCCL's logs (absl's, `NCCL INFO` lines with NCCL_DEBUG=INFO) go straight to
fd 2, where Python's logging never sees them, and they are what a stall report most needs.

`StderrTail` points fd 2 at a pipe read by a small helper process, which copies each chunk to
the real stderr as it comes (the user sees everything, in order, unbuffered) and keeps the
last lines; `lines()` asks it for them. A process, not a thread of ours: a process stuck
holding the GIL (see `faults.Watchdog`) would stop a thread, and what C++ logs while stuck
there (the coordination service waiting for a worker) would sit in the pipe, unseen, until
the backstop's exit dropped it. The pipe's buffer (64 KiB on Linux) only fills while the
helper cannot run; a writer then waits for it, as on a slow terminal.

Children started meanwhile inherit fd 2, the pipe: the helper copies until the last writer
is gone (this process and those children), so what a child writes after `stop()` still
reaches the real stderr.

Run as a script by its path (`python -I stderrtail.py LINES CONTROL_FD`), it imports the
standard library only.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading

# A kept line's length at most: a line of a megabyte (a tensor printed whole) stays readable.
LINE_CHARS = 400
# How long `lines()` waits for the helper's answer.
ANSWER_TIMEOUT_S = 2.0
# Reads of what waits in the pipe before an answer, at most (a read takes up to 64 KiB).
DRAIN_CHUNKS = 16


class StderrTail:
    """Fd 2 through the helper from construction until `stop()`; `stderr` is where the
    helper copies to (a copy of the real stderr, which the caller keeps open until then),
    `keep` how many of the last lines it keeps. Raises OSError where the helper cannot
    start (fd 2 then unchanged)."""

    def __init__(self, stderr: int, keep: int) -> None:
        self._stderr = stderr
        self._lock = threading.Lock()
        data_read, data_write = os.pipe()
        control_read, self._control = os.pipe()
        self._answers, answer_write = os.pipe()
        try:
            self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(keep), str(control_read)],
                stdin=data_read, stdout=answer_write, stderr=stderr, pass_fds=(control_read,))
        except OSError:
            for fd in (data_write, self._control, self._answers):
                os.close(fd)
            raise
        finally:
            for fd in (data_read, control_read, answer_write):
                os.close(fd)
        sys.stderr.flush()
        os.dup2(data_write, 2)
        os.close(data_write)

    def lines(self) -> list[str] | None:
        """The last lines written to fd 2 so far (all of them: the helper reads what is in
        the pipe first), a last unfinished one included; None where the helper does not
        answer."""
        if self._process is None:
            return None
        with self._lock:
            try:
                os.write(self._control, b"lines\n")
                answer = b""
                while not answer.endswith(b"\n"):
                    ready, _, _ = select.select([self._answers], [], [], ANSWER_TIMEOUT_S)
                    chunk = os.read(self._answers, 65536) if ready else b""
                    if not chunk:
                        return None
                    answer += chunk
                kept = json.loads(answer)
            except (OSError, ValueError):
                return None
        return [str(line) for line in kept]

    def stop(self) -> None:
        """Fd 2 back to the real stderr, after the helper copied what this process wrote."""
        if self._process is None:
            return
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        self.lines()  # answered after what was in the pipe is out: nothing passes it
        os.dup2(self._stderr, 2)
        with self._lock:
            for fd in (self._control, self._answers):
                os.close(fd)
        # At its pipe's end it exits; a child that still holds the pipe keeps it copying,
        # and this process does not wait for that child.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=0.2)
        self._process = None


# ------------------------------------------------------------------------- the helper


class _Kept:
    """The last lines of a byte stream, its unfinished last line apart."""

    def __init__(self, keep: int) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._partial = b""

    def add(self, chunk: bytes) -> None:
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        for line in whole[-(self.lines.maxlen or 0):]:
            self.lines.append(_text(line))

    def now(self) -> list[str]:
        return [*self.lines, _text(self._partial)] if self._partial else list(self.lines)


def _text(line: bytes) -> str:
    text = line.decode(errors="replace").rstrip("\r")
    return text if len(text) <= LINE_CHARS else text[:LINE_CHARS] + "..."


def _copy(chunk: bytes, out: list[bool]) -> None:
    """Write `chunk` to fd 2 (the real stderr); once that fails (its reader gone) only
    keep reading, so that no writer blocks."""
    while chunk and out[0]:
        try:
            chunk = chunk[os.write(2, chunk):]
        except OSError:
            out[0] = False


def main(keep: int, control: int) -> None:
    """The helper: copy stdin to stderr, keeping its last lines; answer each request on
    `control` with them, as one JSON line on stdout, after reading what is waiting."""
    # Ctrl-C and a group's SIGTERM are the watched process's; this one ends at its pipe's end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kept = _Kept(keep)
    out = [True]
    ended = False
    requests: int | None = control
    while not ended:
        ready, _, _ = select.select([0] if requests is None else [0, requests], [], [])
        if 0 in ready:
            chunk = os.read(0, 65536)
            ended = not chunk
            _copy(chunk, out)
            kept.add(chunk)
        if requests is not None and requests in ready:
            asked = os.read(requests, 4096)
            if not asked:
                os.close(requests)
                requests = None
                continue
            # What was written before the request is in the pipe by now: read it first (a
            # pipe's worth at most, so that a writer that never pauses cannot hold the answer).
            for _ in range(DRAIN_CHUNKS):
                if ended or not select.select([0], [], [], 0)[0]:
                    break
                chunk = os.read(0, 65536)
                ended = not chunk
                _copy(chunk, out)
                kept.add(chunk)
            answer = (json.dumps(kept.now()) + "\n").encode() * asked.count(b"\n")
            with contextlib.suppress(OSError):
                while answer:
                    answer = answer[os.write(1, answer):]


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
