"""The multi-worker steps of one training run, in the order the trainer takes them."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mgpu_env.config.stalltime import StallTimeout
from mgpu_env.runtime.cluster import Cluster
from mgpu_env.runtime.cluster.scratch import OwnedFolder
from mgpu_env.training.multiworker.agreement import (
    any_worker,
    broadcast_from_chief,
    check_agreement,
)
from mgpu_env.training.multiworker.faults import (
    Watchdog,
    abort_process,
    explain_worker_failure,
    is_worker_failure,
    reclaim_signal_handlers,
)
from mgpu_env.training.multiworker.scratch import remove_scratch_dir, scratch_dir
from mgpu_env.training.multiworker.stall import Among, StallWatch, Watched, resumes_with
from mgpu_env.training.multiworker.stallhints import (
    EVALUATING,
    FIRST_STEP,
    MODEL,
    SAVING,
    STEPS,
    STOPPING,
    STRATEGY,
    Devices,
)

# The session's progress words -> the stall watch's phases.
_STALL_PHASES = {"saving the checkpoint": SAVING, "training": STEPS, "evaluating": EVALUATING}

# ------------------------------------------------------------------------------ session


def peers_of(cluster: Cluster | None) -> dict[str, str]:
    """The other workers of `cluster`, by name ("worker 1") -> address."""
    if cluster is None:
        return {}
    return {
        f"{job} {index}": address
        for job, addresses in cluster.jobs.items()
        for index, address in enumerate(addresses)
        if address != cluster.address
    }


def stall_watch(timeout: StallTimeout, devices: Devices, resume: str,
                cluster: Cluster | None, worker_timeout_s: float) -> StallWatch:
    """A run's stall watch; a worker's names it, asks its peers when stuck where Python
    cannot run, and waits on the others WORKER_TIMEOUT at most in each phase."""
    if cluster is None:
        return StallWatch(timeout, Watched(devices, resumes_with(resume)))
    among = Among(cluster.name, cluster.line_tag, peers_of(cluster), worker_timeout_s)
    return StallWatch(timeout, Watched(devices, resumes_with(resume), among))



class WorkerSession:
    """The multi-worker steps of one training run, in the order the trainer takes them.

    For a single-process run (`role` None) every method does nothing but move `stall` (its
    stall watch, if any) from phase to phase, so the training loop has one path. Between
    workers, a stall watch that is on is the worker's one watchdog (one process has one
    faulthandler timer): each phase its bound, WORKER_TIMEOUT at most; with STALL_TIMEOUT=0
    WORKER_TIMEOUT's watchdog bounds every wait alone. Order:
    `join` (before the strategy exists), `after_strategy` (right after), `checkpoint_dir`,
    `share_restored` (after the chief restored), `progress` (after every completed unit of
    work), `close`.
    """

    def __init__(
        self,
        cluster: Cluster | None,
        timeout_s: float,
        on_expire: Callable[[str], None] = abort_process,
        stall: StallWatch | None = None,
    ) -> None:
        self.stall = stall
        self.role = cluster.role if cluster is not None else None
        self._scratch: OwnedFolder | None = None
        self._agree: Callable[[tuple[bool, ...]], tuple[bool, ...]] | None = None
        self.who = cluster.name if cluster is not None else "this process"
        self._cluster = cluster
        # Every line a worker prints starts so (the CLI's `LineTag`), this library's too.
        self.tag = cluster.line_tag if cluster is not None else ""
        if on_expire is abort_process:
            on_expire = functools.partial(abort_process, tag=self.tag)
        # Between workers the stall watch (when on) is built with the peers and tag too.
        self.watchdog: Watchdog | None = None
        if stall is None or stall.timeout.off:
            self.watchdog = Watchdog(timeout_s, self.who, on_expire, peers=self._peers(),
                                     tag=self.tag)
        self.timeout_s = timeout_s

    @property
    def multi(self) -> bool:
        return self.role is not None

    def _peers(self) -> dict[str, str]:
        return peers_of(self._cluster)

    def join(self) -> None:
        """Bound the wait for the other workers (the strategy's start)."""
        if self.stall is not None:
            self.stall.phase(STRATEGY)
        if self._cluster is None:
            return
        others = ", ".join(f"{name} ({address})" for name, address in self._peers().items())
        sys.stderr.write(
            f"{self.tag}{self.who}: waiting up to {self.timeout_s:g} s "
            f"(WORKER_TIMEOUT) for {others} to join; past that, this worker stops (exit 1) "
            "and says which did not answer.\n"
        )
        if self.watchdog is not None:
            self.watchdog.start(f"waiting for the other workers to join ({others})")

    def after_strategy(self, strategy: Any, values: Mapping[str, str]) -> None:
        """Take SIGTERM back from TensorFlow, then check the workers agree (`check_agreement`).

        Creating MultiWorkerMirroredStrategy installs TensorFlow's own SIGTERM handler (for
        its preemption notice) over ours, which then never runs: `docker stop` would wait
        for SIGKILL. Measured with TF 2.21: SIGTERM to both workers changed nothing.
        """
        if self.stall is not None:
            self.stall.phase(MODEL)
        if self.multi:
            assert self.role is not None
            reclaim_signal_handlers()
            self._progress("comparing settings with the other workers")
            check_agreement(strategy, values, self.role)
            self._progress("building the model")

    def checkpoint_dir(self, chief_dir: Path) -> Path:
        """The chief's real folder for the chief; a scratch folder for every other worker."""
        if self.role is None or self.role.is_chief:
            return chief_dir
        self._scratch = scratch_dir(self.role)
        return self._scratch.path

    def share_restored(self, strategy: Any, variables: Sequence[Any]) -> None:
        if self.stall is not None:
            self.stall.phase(FIRST_STEP)
        if self.multi:
            assert self.role is not None
            self._progress("receiving the chief's checkpoint")
            broadcast_from_chief(strategy, variables, self.role.is_chief)
            self._progress("training")

    def agree(self, strategy: Any, flags: tuple[bool, ...]) -> tuple[bool, ...]:
        """Each flag true on every worker when it is on any (`any_worker`); as is, alone."""
        if not self.multi:
            return flags
        if self._agree is None:
            self._agree = any_worker(strategy)
        return self._agree(flags)

    def progress(self, phase: str | None = None) -> None:
        if self.stall is not None:
            if phase is None:
                self.stall.call_done()
            else:
                self.stall.phase(_STALL_PHASES.get(phase, phase))
        if self.multi:
            self._progress(phase)

    def _progress(self, phase: str | None) -> None:
        if self.watchdog is not None:
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
        if self.stall is not None and (succeeded or not self.multi):
            self.stall.stop()
        elif self.stall is not None and self.stall.current != STOPPING:
            self.stall.phase(STOPPING)
        if succeeded and self.watchdog is not None:
            self.watchdog.stop()
