"""Several workers on this machine started by one command.

That is `mgpu train --workers N` and `mgpu run --workers N SCRIPT` (as `torchrun
--nproc_per_node` does for PyTorch).

The plan is pure data: N loopback addresses on free ports, each worker's share of the
selected GPUs, the run folder they share, and each worker's environment (WORKER_HOSTS and
WORKER_INDEX, which the workers read like any cluster: `cluster.explicit`). `supervise`
then does it: it starts one `mgpu` process per worker, prefixes each of their lines with
`[worker i] `, forwards SIGINT/SIGTERM/SIGHUP to all of them, stops all when one fails
(and, with MAX_RESTARTS=K, starts them all again from the last checkpoint, up to K times),
and returns the exit code by these rules:

- every worker exited 0: 0;
- the launcher was sent a signal: 128 + that signal (130 Ctrl-C, 143 SIGTERM), what each
  worker itself exits with when it stops for it;
- else the code of the first worker that failed (the others were stopped because of it);
  a worker killed by signal N counts as 128 + N, as a shell reports it; after restarts,
  the code of the last attempt.

No worker outlives the launcher: the kernel kills each when the launcher dies, SIGKILL
included (`die_with_launcher`), so a killed launcher never leaves workers holding the GPUs
and the ports. Nor their files: every worker's TMPDIR is a folder the launcher owns
(`scratch.owned_folder`), emptied between restarts and removed at the end, and what a killed
launcher left is removed by the next one (`scratch.sweep_abandoned`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_STALLED, exit_for_signal
from mgpu_env.runtime.cluster.attempts import Ended, Recovery, StderrKept, Supervised
from mgpu_env.runtime.cluster.model import line_tag
from mgpu_env.runtime.cluster.scratch import OwnedFolder, owned_folder, sweep_abandoned
from mgpu_env.runtime.runfolder import run_name

LOOPBACK = "127.0.0.1"
# Seconds the other workers get to stop at a step boundary (their SIGTERM checkpoint)
# once one has failed, before they are killed: the compose files' stop_grace_period.
STOP_GRACE_S = 60.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
MAX_WORKERS = 64
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class LocalWorkers:
    """N workers on this machine: their addresses, GPU shares and shared run folder."""

    hosts: tuple[str, ...]
    gpus: tuple[str | None, ...]  # each worker's GPUS; None: the setting as it is
    run_name: str | None  # set for all when neither OUTPUT_DIR nor RUN_NAME is

    @property
    def count(self) -> int:
        return len(self.hosts)

    def environment(self, index: int) -> dict[str, str]:
        """What worker `index` gets on top of the launcher's environment."""
        env = {"WORKER_HOSTS": ",".join(self.hosts), "WORKER_INDEX": str(index)}
        if self.gpus[index] is not None:
            env["GPUS"] = str(self.gpus[index])
        if self.run_name:
            env["RUN_NAME"] = self.run_name
        return env

    def describe(self, max_restarts: int = 0) -> list[str]:
        """The launcher's start lines: who listens where, with which GPUs."""
        lines = [f"{self.count} workers on this machine, worker 0 the chief"
                 + (f"; run folder name {self.run_name}" if self.run_name else "")
                 + (f"; up to {max_restarts} restart(s) if one dies" if max_restarts else "")]
        for index, host in enumerate(self.hosts):
            share = self.gpus[index]
            where = f"GPUs {share}" if share not in (None, "none") else "the CPU"
            lines.append(f"  worker {index}  {host}  {where}")
        return lines

    def name(self, index: int) -> str:
        """How the launcher's lines name a process: `worker 1`."""
        return f"worker {index}"

    def tag(self, index: int) -> str:
        """What starts each of its relayed lines: `[worker 1] `."""
        return line_tag(index)

    def renewed(self, ports: Callable[[int], list[int]]) -> LocalWorkers:
        """The plan of a restart: the same workers on fresh ports (the last attempt's may
        still be in TIME_WAIT, or taken since)."""
        return dataclasses.replace(
            self, hosts=tuple(f"{LOOPBACK}:{port}" for port in ports(self.count)))


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct ports nothing listens on now (the kernel's choice, as torchrun's).
    Another process may take one before the worker binds it: that worker then fails, and
    the launcher stops the rest with its message."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def gpu_shares(
    workers: int, selected: Sequence[int], per_worker: int | None
) -> tuple[str | None, ...]:
    """Each worker's GPUS: consecutive slices of the selected GPU indices (nvidia-smi
    order), `per_worker` each, or the selection split evenly (one process per GPU when
    there are as many workers as GPUs). No GPU selected: every worker keeps the setting."""
    if not selected:
        if per_worker:
            raise ConfigError(
                f"--gpus-per-worker {per_worker} but no GPU is selected here.\n"
                "  Fix: leave --gpus-per-worker out (the workers share the CPU), or select "
                "GPUs with GPUS."
            )
        return (None,) * workers
    if per_worker is None:
        if len(selected) % workers:
            raise ConfigError(
                f"--workers {workers} cannot share {len(selected)} GPU(s) evenly.\n"
                f"  Valid: a number of workers that divides {len(selected)}, or "
                "--gpus-per-worker K with workers x K at most the GPUs. Fix: "
                f"--workers {len(selected)} --gpus-per-worker 1 (one process per GPU)."
            )
        per_worker = len(selected) // workers
    if per_worker < 1 or workers * per_worker > len(selected):
        raise ConfigError(
            f"--workers {workers} with --gpus-per-worker {per_worker} needs "
            f"{workers * per_worker} GPUs; {len(selected)} are selected "
            f"({','.join(map(str, selected))}).\n  Fix: fewer workers, fewer GPUs per "
            "worker, or select more GPUs with GPUS."
        )
    return tuple(
        ",".join(str(i) for i in selected[w * per_worker:(w + 1) * per_worker])
        for w in range(workers)
    )


@dataclass(frozen=True)
class LaunchingHere:
    """What the launcher's runtime and settings give `--workers N`: the selected GPUs'
    indices, whether the run folder is named (OUTPUT_DIR or RUN_NAME is set), and the engine
    of the cluster this process already belongs to (None: none)."""

    selected_gpus: Sequence[int]
    has_run_folder: bool
    cluster_engine: str | None = None


def plan_local_workers(
    workers: int, gpus_per_worker: int | None, here: LaunchingHere,
    *, ports: Callable[[int], list[int]] = free_loopback_ports, now: float | None = None,
) -> LocalWorkers:
    """The plan for `--workers N`. Refuses (ConfigError, exit 2) a count out of range and
    a process that is already part of a cluster. Without a named run folder the workers get
    one RUN_NAME, the launcher's UTC timestamp (the form of mgpu's default run folder), since
    each would otherwise take its own."""
    selected_gpus, has_run_folder = here.selected_gpus, here.has_run_folder
    cluster_engine = here.cluster_engine
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(
            f"--workers {workers} is out of range.\n  Valid: 1 to {MAX_WORKERS}. "
            "Fix: --workers 2 (or as many as the GPUs)."
        )
    if cluster_engine is not None:
        raise ConfigError(
            f"--workers starts the workers here, but this process is already a worker of "
            f"a cluster ({cluster_engine}).\n  Fix: leave --workers out (the cluster's "
            "engine starts the workers), or unset WORKER_HOSTS/TF_CONFIG."
        )
    stamp = run_name(now)
    hosts = tuple(f"{LOOPBACK}:{port}" for port in ports(workers))
    return LocalWorkers(hosts, gpu_shares(workers, selected_gpus, gpus_per_worker),
                        None if has_run_folder else stamp)


# ----------------------------------------------------------------------- doing it


def exit_code_of(returncode: int) -> int:
    """A child's exit as a shell reports it: killed by signal N is 128 + N."""
    return exit_for_signal(-returncode) if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """A worker's end as the log names it: `exited 3`, `exited 137 (killed by SIGKILL)`."""
    code = exit_code_of(returncode)
    if returncode >= 0:
        return f"exited {code}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"exited {code} (killed by {name})"


def die_with_launcher(launcher_pid: int) -> Callable[[], None] | None:
    """The `preexec_fn` that ties a worker's life to the launcher's (Linux; None elsewhere).

    The kernel sends the worker SIGKILL when the launcher dies, however it dies, SIGKILL
    included (`PR_SET_PDEATHSIG`, prctl(2)); a launcher that can still forward signals
    stops its workers itself. The launcher may die between the fork and the prctl: the
    worker then already has another parent and kills itself. libc's prctl is looked up
    here, before the fork, so the child only calls it (no loading after a fork). The
    kernel watches the thread that started the worker: `supervise` starts every worker
    from its own thread, which lives until they have all ended.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != launcher_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _pump(stream: IO[str], tag: str, out: IO[str], lock: threading.Lock,
          kept: StderrKept | None = None) -> None:
    """Copy a worker's lines to `out`, each with its tag. mgpu's own lines carry it
    already (the worker knows its index); a script's and TensorFlow's do not. `kept`
    keeps what a recovery and the launcher's words read (the last lines, the first error)."""
    for line in stream:
        text = line if line.startswith(tag) else tag + line
        if kept is not None:
            kept.add(text, tag)
        with lock:
            out.write(text if text.endswith("\n") else text + "\n")
            out.flush()
    stream.close()


@contextmanager
def _forwarding(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Hand SIGINT/SIGTERM/SIGHUP to `on_signal` while workers run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda sig, _frame: on_signal(sig))
                for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(process: subprocess.Popen[str], sig: int) -> None:
    # Each worker leads its own process group (as a terminal's job would): the signal
    # reaches its helpers too, and a terminal's Ctrl-C reaches it only through here.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


@dataclass(frozen=True)
class Supervision:
    """How `supervise` watches the workers: the restarts allowed (MAX_RESTARTS), where their
    output goes (None: this process's), how long a stopped worker has before it is killed,
    how often they are looked at, where a restart's fresh ports come from, and the recovery
    that decides each restart's plan (None: the same plan again)."""

    max_restarts: int = 0
    stdout: IO[str] | None = None
    stderr: IO[str] | None = None
    grace_s: float = STOP_GRACE_S
    poll_s: float = 0.2
    ports: Callable[[int], list[int]] = free_loopback_ports
    recovery: Recovery | None = None


def supervise(
    plan: Supervised, command: Sequence[str], environ: Mapping[str, str],
    how: Supervision = Supervision(),
) -> int:
    """Run `command` (argv) once per worker with its environment, until all have exited;
    return the launcher's exit code (the module's rules). A worker that fails stops all;
    up to `max_restarts` times they are then all started again, on fresh `ports` (mgpu
    train resumes from the run folder's last checkpoint, a script from its own), each
    restart in the log with its cause. A failure that a restart would repeat (exit 2:
    bad settings or input) and a signal to the launcher are never restarted. `recovery`
    decides each restart's plan from the failure (another all-reduce, fewer GPUs), or that
    there is none worth starting."""
    max_restarts, grace_s, poll_s = how.max_restarts, how.grace_s, how.poll_s
    workers = _Workers(how.stdout or sys.stdout, how.stderr or sys.stderr)
    temporary = _workers_temporary_folder(environ)
    environ = {**environ, "TMPDIR": str(temporary.path)}
    try:
        with _forwarding(workers.on_signal):
            for attempt in range(max_restarts + 1):
                if attempt:
                    temporary.clear()  # every worker of the last attempt has ended
                workers.start_all(plan, command, environ)
                while workers.running():
                    workers.check(grace_s)
                    time.sleep(poll_s)
                workers.check(grace_s)  # the look at the end: all may have ended since
                code = workers.finish()
                if not workers.restart(attempt, max_restarts, plan):
                    return code
                renewed = plan.renewed(how.ports)
                if (recovery := how.recovery) is not None:
                    index, returncode = workers.failed[0]
                    next_plan = recovery(
                        Ended(index, returncode, workers.recent[index].lines()), renewed)
                    if next_plan is None:
                        return code
                    renewed = next_plan
                plan = renewed
        return code
    finally:
        temporary.remove()


def _workers_temporary_folder(environ: Mapping[str, str]) -> OwnedFolder:
    """The workers' TMPDIR, a folder the launcher owns in the temporary folder they would
    have used: whatever a worker leaves there (a killed worker's scratch checkpoints,
    TensorFlow's or a script's temporary files) is removed when they have all ended, between
    restarts and at the end. What a killed launcher left there is removed first."""
    parent = Path(environ["TMPDIR"]) if environ.get("TMPDIR") else None
    sweep_abandoned(parent)
    try:
        return owned_folder("workers-", parent)
    except OSError as err:
        where = parent or "the temporary folder"
        raise ConfigError(
            f"The workers' temporary folder cannot be made in {where} "
            f"({err.strerror or err}).\n  Fix: point TMPDIR at a folder this user can "
            "write, or unset it."
        ) from None


@dataclass
class _Workers:
    """The running workers and what happened to them: signals received, the first to fail."""

    stdout: IO[str]
    stderr: IO[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    pumps: list[threading.Thread] = field(default_factory=list)
    received: list[int] = field(default_factory=list)  # kept across restarts
    failed: list[tuple[int, int]] = field(default_factory=list)  # (worker, returncode)
    stopping_since: list[float] = field(default_factory=list)
    # When each worker exited (monotonic clock), read by a thread blocked on its wait:
    # of two failed workers, the one that failed first is the cause, even when both are
    # seen in one look (a worker whose peer dies follows it within milliseconds).
    ended: dict[int, float] = field(default_factory=dict)
    recent: list[StderrKept] = field(default_factory=list)  # what each one's stderr left
    names: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        with self.lock:
            self.stderr.write(f"mgpu: {line}\n")
            self.stderr.flush()

    def start_all(self, plan: Supervised, command: Sequence[str],
                  environ: Mapping[str, str]) -> None:
        """Start every worker of `plan`, a new attempt: the last one's record cleared."""
        self.processes, self.pumps, self.failed, self.stopping_since = [], [], [], []
        self.ended, self.recent = {}, []
        self.names = [plan.name(index) for index in range(plan.count)]
        preexec = die_with_launcher(os.getpid())
        for index in range(plan.count):
            if self.received:  # a signal came while they started: start no more
                break
            self.start(index, command, {**environ, **plan.environment(index)}, preexec,
                       tag=plan.tag(index))

    def start(self, index: int, command: Sequence[str], environment: Mapping[str, str],
              preexec: Callable[[], None] | None = None, tag: str | None = None) -> None:
        """Start worker `index` in its own session, its output copied with its tag."""
        process = subprocess.Popen(
            list(command), env=dict(environment),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True, preexec_fn=preexec,
        )
        self.processes.append(process)
        tag = line_tag(index) if tag is None else tag
        kept = StderrKept()
        self.recent.append(kept)
        for stream, out, keep in ((process.stdout, self.stdout, None),
                                  (process.stderr, self.stderr, kept)):
            assert stream is not None
            pump = threading.Thread(target=_pump, args=(stream, tag, out, self.lock, keep),
                                    daemon=True)
            pump.start()
            self.pumps.append(pump)
        threading.Thread(target=self._wait, args=(index, process), daemon=True).start()

    def _wait(self, index: int, process: subprocess.Popen[str]) -> None:
        process.wait()
        self.ended[index] = time.monotonic()

    def stop_all(self, sig: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                _signal_group(process, sig)

    def on_signal(self, sig: int) -> None:
        self.received.append(sig)
        self.stop_all(sig)  # a second Ctrl-C is forwarded too: the workers stop at once

    def running(self) -> bool:
        return len(self.ended) < len(self.processes)

    def check(self, grace_s: float) -> None:
        """One look at the workers: the first to fail stops the others, and those still
        running `grace_s` later are killed."""
        failures = sorted((at, index) for index, at in dict(self.ended).items()
                          if self.processes[index].returncode)
        if failures and not self.failed and not self.received:
            index = failures[0][1]
            code = self.processes[index].returncode
            self.failed.append((index, code))
            if code == EXIT_STALLED:  # its report's last lines may still be in the pipe
                for pump in self.pumps[2 * index:2 * index + 2]:
                    pump.join(timeout=2)
            if len(self.processes) > 1:
                # Which worker stalled, and in which phase: its report's first line, once more.
                said = self.recent[index].first_error if index < len(self.recent) else None
                why = f" (stalled: {said})" if said and code == EXIT_STALLED else ""
                self.say(f"{self._name(index)} {describe_exit(code)}{why}; stopping the "
                         "other workers")
            self.stop_all(signal.SIGTERM)
            self.stopping_since.append(time.monotonic())
        if self.stopping_since and time.monotonic() - self.stopping_since[0] > grace_s:
            self.stop_all(signal.SIGKILL)

    def finish(self) -> int:
        """After every worker exited: their last lines copied, the launcher's exit code."""
        for pump in self.pumps:
            pump.join(timeout=5)
        codes = [exit_code_of(p.returncode) for p in self.processes]
        if self.received:
            return 128 + self.received[0]
        if self.failed:
            return exit_code_of(self.failed[0][1])
        return next((code for code in codes if code), 0)

    def _name(self, index: int) -> str:
        return self.names[index] if index < len(self.names) else f"worker {index}"

    def restart(self, attempt: int, max_restarts: int, plan: Supervised) -> bool:
        """Whether the workers, all stopped now, start again; the log says why or why not."""
        if self.received or not self.failed:
            return False
        index, code = self.failed[0]
        cause = f"{self._name(index)} {describe_exit(code)}"
        if code == EXIT_BAD_CONFIG:  # a restart would only repeat it
            if max_restarts:
                self.say(f"{cause} (bad settings or input): a restart would fail the same "
                         "way; not restarting")
            return False
        if attempt == max_restarts:
            if max_restarts:
                self.say(f"{cause}; no restart left (MAX_RESTARTS={max_restarts}, all used)")
            return False
        again = (f"all {plan.count} workers" if plan.count > 1 else "it")
        self.say(f"restart {attempt + 1} of {max_restarts} ({cause}): starting {again} "
                 "again from the last checkpoint")
        return True
