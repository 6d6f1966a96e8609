"""Multi-worker runs: the cluster, the workers' agreement, and stopping when a worker dies.

`mgpu train` runs on several machines with TensorFlow's own collective engine,
`tf.distribute.MultiWorkerMirroredStrategy`, configured by `TF_CONFIG` (what Kubernetes'
TFJob operator and other launchers set) or by `WORKER_HOSTS` + `WORKER_INDEX`, which build
it. Training itself is the same custom step as on one machine (see `mgpu_env.training.steps` for
why it is not `model.fit`); this module adds what only a cluster needs:

- `resolve_cluster` checks the cluster settings together; the runtime
  (`mgpu_env.runtime`) exports the TF_CONFIG TensorFlow reads, before TensorFlow starts.
- `check_agreement` all-gathers the settings that must match on every worker (batch size,
  precision, data set, epochs, ...) and names the first one that differs, before training.
- `broadcast_from_chief` gives every worker the chief's restored checkpoint, so workers
  need no shared folder: the chief's OUTPUT_DIR is the one source of truth, and the others
  write their share of each (collective) checkpoint save to a scratch folder they delete.
- Faults. When a worker process dies, TensorFlow's coordination service (which
  MultiWorkerMirroredStrategy starts) misses its heartbeats and aborts the collectives
  on the others within about 10 s (a reset connection is noticed at once); the step then
  raises, and `explain_worker_failure` turns that into one clear line. Two hangs remain
  that TensorFlow does not bound: a worker that never joins (the others wait in the
  strategy's constructor, where even SIGTERM is swallowed), and a worker alive but stuck
  (its heartbeats continue). `Watchdog` bounds both: when no progress is reported for
  WORKER_TIMEOUT seconds it prints why and ends the process, the one place the library
  exits, because a thread blocked inside a C++ collective cannot be interrupted.

Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import Settings
from mgpu_env.training.strategy import WorkerRole

# Bytes per value in the agreement all-gather; longer values are compared by a digest.
VALUE_WIDTH = 48
# What a worker that hits the watchdog exits with (RunFailed's code).
EXIT_WORKER_LOST = 1
# How long after the watchdog's deadline the GIL-free backstop ends a process that the
# watchdog's own thread could not (see Watchdog).
BACKSTOP_GRACE_S = 5.0


# ------------------------------------------------------------------------------ cluster


@dataclass(frozen=True)
class Cluster:
    """A multi-worker cluster as this process sees it."""

    jobs: dict[str, tuple[str, ...]]  # "chief"/"worker" -> host:port addresses
    task_type: str
    task_index: int
    source: str  # "TF_CONFIG" or "WORKER_HOSTS"

    @property
    def num_workers(self) -> int:
        return sum(len(addresses) for addresses in self.jobs.values())

    @property
    def address(self) -> str:
        return self.jobs[self.task_type][self.task_index]

    @property
    def role(self) -> WorkerRole:
        return WorkerRole(
            self.task_type, self.task_index, self.num_workers, _has_chief="chief" in self.jobs
        )

    @property
    def name(self) -> str:
        """This task as the user reads it: "worker 1 (10.0.0.2:2222)"."""
        return f"{self.task_type} {self.task_index} ({self.address})"

    def tf_config(self) -> str:
        return json.dumps(
            {
                "cluster": {job: list(addresses) for job, addresses in self.jobs.items()},
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )


def resolve_cluster(settings: Settings) -> Cluster | None:
    """The cluster TF_CONFIG or WORKER_HOSTS + WORKER_INDEX describe; None for one process.

    Each setting was validated alone when resolved; this checks them together. Raises
    ConfigError (exit 2).
    """
    hosts, index, tf_config = settings.worker_hosts, settings.worker_index, settings.tf_config
    if tf_config and (hosts or index is not None):
        raise ConfigError(
            "Both TF_CONFIG and WORKER_HOSTS/WORKER_INDEX are set; they describe the same "
            "cluster twice.\n  Fix: unset WORKER_HOSTS and WORKER_INDEX (a launcher set "
            "TF_CONFIG), or unset TF_CONFIG."
        )
    if tf_config:
        config = json.loads(tf_config)
        jobs = {job: tuple(config["cluster"][job]) for job in ("chief", "worker")
                if job in config["cluster"]}
        return Cluster(jobs, config["task"]["type"], int(config["task"]["index"]), "TF_CONFIG")
    if not hosts and index is None:
        return None
    if not hosts:
        raise ConfigError(
            f"WORKER_INDEX={index} is set but WORKER_HOSTS is empty.\n"
            "  Fix: set WORKER_HOSTS to every worker's host:port (the same list on each), "
            "or unset WORKER_INDEX."
        )
    if index is None:
        raise ConfigError(
            f"WORKER_HOSTS lists {len(hosts)} worker(s) but WORKER_INDEX is not set.\n"
            f"  Fix: set WORKER_INDEX to this worker's position in the list, 0..{len(hosts) - 1} "
            "(0 is the chief)."
        )
    if index >= len(hosts):
        raise ConfigError(
            f"WORKER_INDEX={index} but WORKER_HOSTS lists {len(hosts)} worker(s): "
            f"{','.join(hosts)}.\n  Valid: 0..{len(hosts) - 1}. Fix: set WORKER_INDEX to this "
            "worker's position in WORKER_HOSTS."
        )
    return Cluster({"worker": hosts}, "worker", index, "WORKER_HOSTS")


def scratch_dir(role: WorkerRole) -> Path:
    """A private folder for a non-chief worker's share of the checkpoints, deleted after.

    TensorFlow's checkpoint save is collective, so every worker saves; only the chief's
    copy, in OUTPUT_DIR, is kept (the multi-worker tutorial's `write_filepath` pattern).
    """
    return Path(tempfile.mkdtemp(prefix=f"mgpu-{role.task_type}{role.task_id}-ckpt-"))


def remove_scratch_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------- agreement


def agreement_values(
    settings: Settings,
    *,
    dataset: str,
    precision_policy: str,
    local_replicas: int,
    train_samples: int,
    steps_per_epoch: int,
) -> dict[str, str]:
    """What must be equal on every worker, as text keyed by the name the user knows.

    The resolved data set and precision (not the requested `auto`/`1`) are compared, so
    two workers that resolve `auto` differently are caught too. Equal local replicas keep
    the global batch (and the data shards) the same on every worker.
    """
    return {
        "BATCH_SIZE": str(settings.batch_size),
        "EPOCHS": str(settings.epochs),
        "LEARNING_RATE": repr(settings.learning_rate),
        "SEED": str(settings.seed),
        "XLA": str(int(settings.xla)),
        "DATASET": dataset,
        "MODEL": settings.model,
        "MIXED_PRECISION": precision_policy,
        "local replicas (GPUs or VIRTUAL_DEVICES)": str(local_replicas),
        "training samples": str(train_samples),
        "steps per epoch": str(steps_per_epoch),
    }


def encode_values(values: Mapping[str, str], width: int = VALUE_WIDTH) -> list[int]:
    """The values (in key order) as fixed-width byte rows, for an integer all-gather."""
    import hashlib

    row: list[int] = []
    for key in sorted(values):
        data = values[key].encode("utf-8")
        if len(data) > width:
            data = data[: width - 17] + b"~" + hashlib.sha256(data).hexdigest()[:16].encode()
        row.extend(data + bytes(width - len(data)))
    return row


def decode_values(keys: Sequence[str], row: Sequence[int], width: int = VALUE_WIDTH) -> dict[
    str, str
]:
    ordered = sorted(keys)
    return {
        key: bytes(int(b) for b in row[i * width : (i + 1) * width]).rstrip(b"\0").decode(
            "utf-8", "replace"
        )
        for i, key in enumerate(ordered)
    }


def find_disagreements(
    keys: Sequence[str], rows: Mapping[int, Sequence[int]], names: Mapping[int, str]
) -> list[str]:
    """One line per worker whose values differ from the chief's (the first row's task)."""
    reference_id = min(rows)
    reference = decode_values(keys, rows[reference_id])
    lines = []
    for task_id in sorted(rows):
        if task_id == reference_id:
            continue
        theirs = decode_values(keys, rows[task_id])
        differing = [key for key in sorted(keys) if theirs[key] != reference[key]]
        if differing:
            details = ", ".join(
                f"{key}={theirs[key]} there but {reference[key]} on {names[reference_id]}"
                for key in differing
            )
            lines.append(f"{names[task_id]}: {details}")
    return lines


def check_agreement(strategy: Any, values: Mapping[str, str], role: WorkerRole) -> None:
    """All-gather every worker's `values`; raise ConfigError naming what differs.

    Collective: every worker must call it at the same point, right after the strategy is
    created and before any variable exists. Every worker raises, so all of them stop.
    """
    import numpy as np
    import tensorflow as tf

    position = role.task_id + (1 if role.task_type == "worker" and role._has_chief else 0)
    kind = 0 if role.task_type == "chief" else 1
    row = np.array([[position, kind, role.task_id, *encode_values(values)]], dtype=np.int32)
    mine = tf.constant(row)

    @tf.function
    def gather() -> Any:
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_gather(mine, axis=0)
        )

    gathered = strategy.experimental_local_results(gather())[0].numpy()
    # One row per replica; a worker with several replicas sends the same row several times.
    rows = {int(r[0]): [int(v) for v in r[3:]] for r in gathered}
    names = {
        int(r[0]): f"{'chief' if int(r[1]) == 0 else 'worker'} {int(r[2])}" for r in gathered
    }
    problems = find_disagreements(list(values), rows, names)
    if problems:
        raise ConfigError(
            "The workers' settings differ, so they cannot train together:\n  "
            + "\n  ".join(problems)
            + "\n  Fix: give every worker the same settings (the same .env or environment)."
        )


# ---------------------------------------------------------------------------- broadcast


def broadcast_from_chief(strategy: Any, variables: Sequence[Any], is_chief: bool) -> None:
    """Give every worker the chief's values of `variables` (one all-reduce each).

    Each replica contributes zeros except the chief's first one, which contributes the
    value, so the sum is the chief's value everywhere. Used after the chief restored a
    checkpoint: the other workers need not see the chief's folder at all. Every value
    travels as float64 (one dtype, so the all-reduce can pack them): exact for float32 and
    float16 values and for integers (the epoch, the optimizer's step) up to 2**53.
    """
    import tensorflow as tf

    variables = list(variables)

    @tf.function
    def reduce_all() -> Any:
        def replica_fn() -> list[Any]:
            context = tf.distribute.get_replica_context()
            source = tf.logical_and(
                tf.constant(is_chief), tf.equal(context.replica_id_in_sync_group, 0)
            )
            contributions = []
            for v in variables:
                value = tf.cast(tf.convert_to_tensor(v), tf.float64)
                contributions.append(tf.where(source, value, tf.zeros_like(value)))
            return context.all_reduce(tf.distribute.ReduceOp.SUM, contributions)

        return strategy.run(replica_fn)

    reduced = reduce_all()
    for v, value in zip(variables, reduced, strict=True):
        local = strategy.experimental_local_results(value)[0]
        v.assign(tf.cast(local, tf.as_dtype(v.dtype)))


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


def abort_process(message: str) -> None:
    """Print `message` to stderr and end the process now (the watchdog's default action).

    `os._exit`, not `sys.exit`: the main thread may be blocked inside a collective that no
    exception can reach, and interpreter shutdown could wait on it.
    """
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(EXIT_WORKER_LOST)


class Watchdog:
    """Ends the run when no progress is reported for `timeout_s` seconds.

    `start(phase)` arms it; `progress(phase)` pushes the deadline back (call it after every
    completed `train_steps` call, save and evaluation); `stop()` disarms it. On expiry a
    Python thread calls `on_expire` with a message naming the phase, once.

    That thread needs the GIL, and one wait holds it: MultiWorkerMirroredStrategy's
    constructor, waiting for the other workers to join, blocks in C++ without releasing
    it (measured with TF 2.21: the thread never ran; so does SIGTERM's handler, and the
    coordination service's `cluster_register_timeout` did not end the wait either). So
    `backstop` also arms `faulthandler.dump_traceback_later`, whose C thread needs no GIL:
    BACKSTOP_GRACE_S after the deadline it prints "Timeout" and the stacks, and exits 1.
    """

    def __init__(
        self,
        timeout_s: float,
        who: str,
        on_expire: Callable[[str], None] = abort_process,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float | None = None,
        backstop: bool = True,
    ) -> None:
        self.timeout_s = timeout_s
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
        self.expired = False

    def start(self, phase: str) -> None:
        self.progress(phase)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="mgpu-watchdog", daemon=True)
            self._thread.start()

    def progress(self, phase: str | None = None) -> None:
        with self._lock:
            if phase is not None:
                self._phase = phase
            self._deadline = self._clock() + self.timeout_s
        if self._backstop and not self._stop.is_set():
            faulthandler.dump_traceback_later(
                self.timeout_s + BACKSTOP_GRACE_S, repeat=False, file=sys.stderr, exit=True
            )

    def stop(self) -> None:
        self._stop.set()
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
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
                self._on_expire(
                    f"{self.who}: no progress for {self.timeout_s:g} s while {phase}; another "
                    "worker is probably down, stuck or unreachable.\n  Check every worker's "
                    "log; start them all again to resume from the last completed epoch "
                    "(WORKER_TIMEOUT sets this limit)."
                )
                return

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


# ------------------------------------------------------------------------------ session


class WorkerSession:
    """The multi-worker steps of one training run, in the order the trainer takes them.

    For a single-process run (`role` None) every method does nothing, so the training loop
    has one path. Order: `join` (before the strategy exists), `after_strategy` (right after),
    `checkpoint_dir`, `share_restored` (after the chief restored), `progress` (after every
    completed unit of work), `close`.
    """

    def __init__(
        self,
        cluster: Cluster | None,
        timeout_s: float,
        on_expire: Callable[[str], None] = abort_process,
    ) -> None:
        self.role = cluster.role if cluster is not None else None
        self._scratch: Path | None = None
        self.who = cluster.name if cluster is not None else "this process"
        self._cluster = cluster
        self.watchdog = Watchdog(timeout_s, self.who, on_expire)

    @property
    def multi(self) -> bool:
        return self.role is not None

    def join(self) -> None:
        """Bound the wait for the other workers (the strategy's start)."""
        if self._cluster is None:
            return
        others = ", ".join(
            a for addresses in self._cluster.jobs.values() for a in addresses
            if a != self._cluster.address
        )
        sys.stderr.write(
            f"{self.who}: waiting up to {self.watchdog.timeout_s:g} s (WORKER_TIMEOUT) for "
            f"the other workers ({others}); if they do not join, this worker stops with a "
            "'Timeout' report.\n"
        )
        self.watchdog.start(f"waiting for the other workers to join ({others})")

    def after_strategy(self, strategy: Any, values: Mapping[str, str]) -> None:
        """Take SIGTERM back from TensorFlow, then check the workers agree (`check_agreement`).

        Creating MultiWorkerMirroredStrategy installs TensorFlow's own SIGTERM handler (for
        its preemption notice) over ours, which then never runs: `docker stop` would wait
        for SIGKILL. Measured with TF 2.21: SIGTERM to both workers changed nothing.
        """
        if self.multi:
            assert self.role is not None
            reclaim_signal_handlers()
            self.watchdog.progress("comparing settings with the other workers")
            check_agreement(strategy, values, self.role)
            self.watchdog.progress("building the model")

    def checkpoint_dir(self, chief_dir: Path) -> Path:
        """The chief's real folder for the chief; a scratch folder for every other worker."""
        if self.role is None or self.role.is_chief:
            return chief_dir
        self._scratch = scratch_dir(self.role)
        return self._scratch

    def share_restored(self, strategy: Any, variables: Sequence[Any]) -> None:
        if self.multi:
            assert self.role is not None
            self.watchdog.progress("receiving the chief's checkpoint")
            broadcast_from_chief(strategy, variables, self.role.is_chief)
            self.watchdog.progress("training")

    def progress(self, phase: str | None = None) -> None:
        if self.multi:
            self.watchdog.progress(phase)

    def failure(self, err: BaseException) -> str | None:
        """The message for a TensorFlow error that means a worker was lost, else None."""
        if self.multi and is_worker_failure(err):
            assert self.role is not None
            return explain_worker_failure(
                err, self.who, (self.role.task_type, self.role.task_id)
            )
        return None

    def close(self, succeeded: bool) -> None:
        """Delete the scratch folder; disarm the watchdog only after a success.

        After a failure it stays armed, so a process whose shutdown waits on a dead worker
        still ends within WORKER_TIMEOUT.
        """
        if self._scratch is not None:
            remove_scratch_dir(self._scratch)
            self._scratch = None
        if succeeded:
            self.watchdog.stop()
