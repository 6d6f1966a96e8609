"""The watchdog's backstop in words, said by a helper process when Python cannot run here.

A small helper process says which worker is missing when this one is stuck where Python
cannot run.

`faulthandler.dump_traceback_later(exit=True)` is what ends a process stuck in
MultiWorkerMirroredStrategy's constructor (it holds the GIL: see `faults.Watchdog`), but what
it prints is "Timeout (0:00:30)!" and every thread's stack. So its output goes into a pipe
that is full before it writes (`Backstop.dump_fd`): its first write blocks. This helper,
another process and so free of our GIL, keeps the same deadline from the progress lines the
watchdog sends it. When the deadline passes with no progress it asks each other worker's
address whether anything listens there, prints one message (which worker, which address, how
long this one waited), and only then drains the pipe: faulthandler's dump goes nowhere, and
the process exits 1 after the message is out, so a container does not end before it.

Run as a script by its path (`python -I backstop.py CONFIG`), it imports the standard library
only: nothing of mgpu, nothing of TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

# After the faulthandler deadline, how long the helper waits before it speaks: a progress
# line written just before the deadline still arrives in time.
MARGIN_S = 0.5
# How long each peer's address is given to answer a connection.
PROBE_TIMEOUT_S = 2.0
# The setting that bounds a worker's waits unless a phase's bound came from another.
WORKER_TIMEOUT = "WORKER_TIMEOUT"


class Backstop:
    """The helper process and its two pipes: progress lines to it, faulthandler's dump
    into the blocked one. `dump_fd` is what faulthandler writes to. The helper's message
    goes to this process's fd 2: under the stall watch a pipe that another process copies to
    stderr (`stderrtail`), so it gets out while this one is stuck."""

    def __init__(self, who: str, timeout_s: float, grace_s: float,
                 peers: Mapping[str, str], tag: str = "") -> None:
        self._timeout_s = timeout_s
        dump_read, self.dump_fd = os.pipe()
        _fill(self.dump_fd)
        control_read, self._control = os.pipe()
        config = {"who": who, "timeout_s": timeout_s, "grace_s": grace_s,
                  "peers": dict(peers), "tag": tag, "control_fd": control_read}
        self._process = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), json.dumps(config)],
            stdin=dump_read, pass_fds=(control_read,), stdout=subprocess.DEVNULL,
        )
        os.close(dump_read)
        os.close(control_read)

    def progress(self, phase: str, bound_s: float | None = None,
                 setting: str = WORKER_TIMEOUT) -> None:
        """The watchdog's deadline moved: now + `bound_s` (the phase's own bound; None:
        the timeout), in `phase`; `setting` ("STALL_TIMEOUT=4s", no spaces) is what set
        that bound, for the message to name."""
        bound = self._timeout_s if bound_s is None else bound_s
        self._send(f"progress {time.monotonic()} {bound} {setting.replace(' ', '')} {phase}")

    def close(self) -> None:
        """Disarmed for good (faulthandler's timer cancelled first): the helper ends."""
        for fd in (self._control, self.dump_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()

    def _send(self, line: str) -> None:
        # The helper gone: faulthandler still ends a stuck process, unexplained.
        with contextlib.suppress(OSError):
            os.write(self._control, (line.replace("\n", " ") + "\n").encode())


def _fill(fd: int) -> None:
    """Fill the pipe, so that the next write to it blocks until the other end reads."""
    os.set_blocking(fd, False)
    try:
        # Pages first, then bytes: a write of up to a page is all or nothing, so the pages
        # alone can leave almost a page free.
        for size in (4096, 1):
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(fd, b"\n" * size)
    finally:
        os.set_blocking(fd, True)


# ------------------------------------------------------------------------- the helper


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """What a worker's `host:port` says to a connection: "listening", or why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return "listening"
    except socket.gaierror:
        return f"its host name {host} does not resolve"
    except ConnectionRefusedError:
        return "nothing listens there (not started yet, or another port)"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s (a firewall, or the host is down)"
    except (OSError, ValueError) as err:
        return f"it cannot be reached ({err.strerror or err})" if isinstance(
            err, OSError) else f"it is not host:port ({err})"


def stuck_message(who: str, phase: str, waited_s: float, timeout_s: float, grace_s: float,
                  peers: Mapping[str, str], found: Mapping[str, str],
                  setting: str = WORKER_TIMEOUT) -> str:
    """The message for a worker stuck `waited_s` seconds in `phase` (the bound `timeout_s`
    that `setting` set, then the backstop's `grace_s`); `found` is `probe`'s answer for each
    peer (name -> address)."""
    missing = [f"{name} ({peers[name]}): {found[name]}" for name in peers
               if found[name] != "listening"]
    # The stall watch's phase of the strategy's build (`stallhints.STRATEGY`) is the join
    # too: MultiWorkerMirroredStrategy's constructor waits there for every worker.
    if phase.startswith(("waiting for the other workers", "building the strategy")):
        head = f"{who} waited {waited_s:.0f} s for the other workers to join"
    else:
        head = f"{who} made no progress for {waited_s:.0f} s while {phase}"
    if missing:
        cause = "; ".join(missing)
        fix = (f"start {_names(peers, found)} with the same cluster settings, or check that "
               "its address can be reached from here")
    else:
        cause = "every other worker's address answers, but the cluster did not go on"
        fix = ("check every worker's log (a worker stuck or stopped, or workers with "
               "different WORKER_HOSTS); start them all again to resume")
    if setting == WORKER_TIMEOUT:
        bound = (f"WORKER_TIMEOUT={timeout_s:g} (then {grace_s:g} s of grace) sets how long "
                 "a worker waits.")
    else:
        # The stall watch's bound for this phase (STALL_TIMEOUT set, or auto's), under
        # WORKER_TIMEOUT: naming WORKER_TIMEOUT would send the user to the wrong setting.
        bound = (f"{setting} bounded this phase at {timeout_s:g} s (then {grace_s:g} s of "
                 "grace); WORKER_TIMEOUT caps it for a worker.")
    return f"{head}: {cause}.\n  Fix: {fix}. {bound}"


def _names(peers: Mapping[str, str], found: Mapping[str, str]) -> str:
    return " and ".join(name for name in peers if found[name] != "listening")


def _lines(fd: int) -> list[str] | None:
    """The complete lines waiting on `fd`; None at its end."""
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return None if not data else data.decode(errors="replace").splitlines()
        data += chunk
        if data.endswith(b"\n"):
            return data.decode(errors="replace").splitlines()


def main(config: Mapping[str, Any]) -> None:
    """The helper: follow the progress lines; at a deadline passed, speak and drain."""
    # Ctrl-C and a group's SIGTERM are the watched process's to handle; this one ends when
    # that one does (its end of the pipe closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    control = int(config["control_fd"])
    timeout_s = float(config["timeout_s"])
    grace_s = float(config["grace_s"])
    bound_s = timeout_s
    setting = WORKER_TIMEOUT
    peers = {str(k): str(v) for k, v in config["peers"].items()}
    last: float | None = None
    phase = ""
    while True:
        wait = None if last is None else max(
            0.0, last + bound_s + grace_s + MARGIN_S - time.monotonic())
        ready, _, _ = select.select([control], [], [], wait)
        if ready:
            lines = _lines(control)
            if lines is None:
                return  # the watched process ended
            for line in lines:
                if line.startswith("progress "):
                    _, stamp, bound, setting, phase = [*line.split(" ", 4), ""][:5]
                    last, bound_s = float(stamp), float(bound)
            continue
        assert last is not None
        found = {name: probe(address) for name, address in peers.items()}
        message = stuck_message(config["who"], phase, time.monotonic() - last, bound_s,
                                grace_s, peers, found, setting)
        tag = config["tag"]
        sys.stderr.write("".join(f"{tag}{line}\n" for line in
                                 f"error: {message}".splitlines()))
        sys.stderr.flush()
        # Now faulthandler may write its dump (into this pipe, read and dropped) and exit.
        while os.read(0, 65536):
            pass
        return


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
