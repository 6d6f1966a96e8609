"""The epochs of a run: one object holds what they share, and what happens around the steps
is a list of small actions, as orbit's Controller runs its trainer and calls its Actions.

`Run.train_epoch(epoch)` runs an epoch in calls of at most STEPS_PER_CALL steps. After each
call, every action in `Run.after_call` sees a `CallEnd` (the heartbeat, the finite checks,
the progress bar, a stop request); after the epoch, every action in `Run.after_epoch` sees
its record (history.json, the checkpoint, TensorBoard, the epoch line). An action raises
to stop the run; none returns anything.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import RunFailed
from mgpu_env.training.input.corrupt import stop_on_bad_records
from mgpu_env.training.input.data import Data
from mgpu_env.training.input.feed import Feed
from mgpu_env.training.input.order import STEPS_PER_CALL
from mgpu_env.training.multiworker import WorkerSession
from mgpu_env.training.run import rundir
from mgpu_env.training.run.plan import TRAIN_SETTINGS, DataPlan, TrainPlan
from mgpu_env.training.run.report import Reporter
from mgpu_env.training.run.signals import Interrupted, StopRequest
from mgpu_env.training.step.build import Trainer


@dataclass
class Checkpoints:
    """The run's checkpoint, its manager and the epoch it counts."""

    checkpoint: Any
    manager: Any
    epoch: Any  # tf.Variable: epochs completed
    directory: Path


@dataclass(frozen=True)
class CallEnd:
    """Where an epoch stands after one call of the compiled steps."""

    epoch: int  # counted from 0
    done: int  # steps of this epoch done so far
    loss: float
    accuracy: float


@dataclass
class Run:
    """What the epochs of one run share: the trainer, its checkpoints, the worker session,
    the reporter, the stop request, the summary writer, the data and its feed, and what has
    been trained so far."""

    plan: TrainPlan
    data_plan: DataPlan  # the feed and the steps per epoch the data's sizes decided
    trainer: Trainer
    saved: Checkpoints
    session: WorkerSession
    reporter: Reporter
    stop: StopRequest
    writer: Any  # tf.summary writer (a no-op one on a worker that is not the chief)
    data: Data
    feed: Feed
    start_epoch: int
    history: list[dict[str, Any]] = field(default_factory=list)
    trained_samples: int = 0
    trained_seconds: float = 0.0
    after_call: list[Callable[[Run, CallEnd], None]] = field(default_factory=list)
    after_epoch: list[Callable[[Run, dict[str, Any]], None]] = field(default_factory=list)

    def train(self) -> None:
        """The epochs left, each stopped first by a stop request received between them."""
        for epoch in range(self.start_epoch, self.plan.settings.epochs):
            if self.stop.requested:
                raise_interrupted(self, epoch)
            self.train_epoch(epoch)

    def train_epoch(self, epoch: int) -> None:
        """One epoch, in calls of at most STEPS_PER_CALL steps, then its record."""
        steps, per_epoch = self.trainer.steps, self.data_plan.steps_per_epoch
        run_steps = self.feed.runner(steps, epoch)
        steps.reset_train_metrics()
        self.reporter.epoch_begin(epoch + 1, self.plan.settings.epochs, per_epoch)
        epoch_start = time.perf_counter()
        done = 0
        while done < per_epoch:
            count = min(STEPS_PER_CALL, per_epoch - done)
            with stop_on_bad_records(self.data, ("train",), epoch, self.plan.resume_command):
                run_steps(count)
            done += count
            call = CallEnd(epoch, done, float(steps.train_loss.result()),
                           float(steps.train_accuracy.result()))
            for action in self.after_call:
                action(self, call)
        seconds = time.perf_counter() - epoch_start
        samples = per_epoch * self.plan.global_batch_size
        record = {"epoch": epoch + 1, "loss": call.loss, "accuracy": call.accuracy,
                  "samples_per_sec": samples / seconds, "seconds": seconds}
        self.trained_samples += samples
        self.trained_seconds += seconds
        for end in self.after_epoch:
            end(self, record)

    def metrics(self, test_loss: float, test_accuracy: float, wall_time_s: float) -> dict[
        str, Any
    ]:
        """metrics.json: the run's results, its plan and its settings."""
        plan = self.plan
        described = plan.describe(self.data_plan)
        return {
            "schema_version": rundir.SCHEMA_VERSION,
            "status": "finished",
            "epochs_completed": plan.settings.epochs,
            "resumed_from_epoch": self.start_epoch,
            "replicas": plan.replicas,
            "per_replica_batch_size": plan.per_replica_batch_size,
            "global_batch_size": plan.global_batch_size,
            "precision_policy": plan.precision.policy,
            "dataset": plan.dataset.name,
            "train_samples_per_sec": self.samples_per_sec(),
            "test_accuracy": test_accuracy,
            "test_loss": test_loss,
            "history": self.history,
            "training_time_s": self.trained_seconds,
            "wall_time_s": wall_time_s,
            "train_samples": self.data.train_size,
            "test_samples": self.data.test_size,
            "devices": described["devices"],
            "device_names": described["physical_devices"],
            "device_type": plan.device_type,
            "cross_device_ops": plan.strategy.cross_device_ops,
            "xla": plan.xla,
            "settings": {
                k: v for k, v in plan.settings.describe().items() if k in TRAIN_SETTINGS
            },
            "mgpu_version": __version__,
        }

    def samples_per_sec(self) -> float:
        """This process's training throughput; when it trained no epoch (it resumed a run
        killed after its last checkpoint), the mean of the epochs the history recorded."""
        if self.trained_seconds > 0:
            return self.trained_samples / self.trained_seconds
        rates = [float(e["samples_per_sec"]) for e in self.history if "samples_per_sec" in e]
        return sum(rates) / len(rates) if rates else 0.0


# --------------------------------------------------------------------- after each call


def heartbeat(run: Run, call: CallEnd) -> None:
    """Multi-worker: this worker is alive and training (the watchdog's clock)."""
    run.session.progress()


def loss_is_finite(run: Run, call: CallEnd) -> None:
    if not math.isfinite(call.loss):
        raise_non_finite(run, call, f"The training loss became {call.loss}")


def weights_are_finite(run: Run, call: CallEnd) -> None:
    if not bool(run.trainer.steps.weights_finite()):
        raise_non_finite(run, call, "The model's weights became NaN or "
                         f"infinite (the loss reads {call.loss:.4f})")


def show_progress(run: Run, call: CallEnd) -> None:
    run.reporter.steps_done(call.done, call.loss, call.accuracy)


def stop_if_requested(run: Run, call: CallEnd) -> None:
    """Mid-epoch state is not saved: resuming restarts this epoch from the last completed
    one, so a resumed run trains exactly like an uninterrupted one. (At the epoch's end the
    checkpoint is saved first: the next epoch's start stops.)"""
    if run.stop.requested and call.done < run.data_plan.steps_per_epoch:
        raise_interrupted(run, call.epoch)


AFTER_CALL: tuple[Callable[[Run, CallEnd], None], ...] = (
    heartbeat, loss_is_finite, weights_are_finite, show_progress, stop_if_requested,
)


# -------------------------------------------------------------------- after each epoch


def keep_history(run: Run, record: dict[str, Any]) -> None:
    """history.json first, the checkpoint second: on resume, history is cut back to the
    checkpoint's epoch, so a kill between the two loses nothing."""
    run.history = [*run.history, record]
    if run.plan.is_chief:
        rundir.write_history(run.plan.output_dir, run.history)


def save_checkpoint(run: Run, record: dict[str, Any]) -> None:
    run.saved.epoch.assign(record["epoch"])
    run.session.progress("saving the checkpoint")
    run.saved.manager.save(checkpoint_number=record["epoch"])
    run.session.progress("training")


def write_summaries(run: Run, record: dict[str, Any]) -> None:
    """TensorBoard's scalars of the epoch (a no-op writer on the other workers)."""
    import tensorflow as tf

    with run.writer.as_default(step=record["epoch"]):
        for name in ("loss", "accuracy", "samples_per_sec"):
            tf.summary.scalar(name, record[name])
    run.writer.flush()


def report_epoch(run: Run, record: dict[str, Any]) -> None:
    run.reporter.epoch_end(record)


AFTER_EPOCH: tuple[Callable[[Run, dict[str, Any]], None], ...] = (
    keep_history, save_checkpoint, write_summaries, report_epoch,
)


# ---------------------------------------------------------------------------- stopping


def raise_non_finite(run: Run, call: CallEnd, what: str) -> None:
    """Stop at once on a NaN or infinite loss, as Keras' TerminateOnNaN does, or on NaN or
    infinite weights: the weights are already non-finite, so this epoch is never saved and
    the last good checkpoint stays the one a new start resumes from."""
    kept = rundir.checkpoint_kept(call.epoch)
    raise RunFailed(
        f"{what} in epoch {call.epoch + 1} (within its first {call.done} "
        f"steps): training stopped and nothing of this epoch was saved; {kept}.\n"
        "  Cause: NaN or infinite values in streamed samples (data read whole is checked "
        f"before training), or a learning rate too high (LEARNING_RATE="
        f"{run.plan.settings.learning_rate}).\n"
        f"  Fix: repair the data and resume with: {run.plan.resume_command}; or "
        "start over with a lower LEARNING_RATE in another OUTPUT_DIR."
    )


def raise_interrupted(run: Run, epoch: int) -> None:
    signum = run.stop.signum or signal.SIGTERM
    name = signal.Signals(signum).name
    kept = rundir.checkpoint_kept(epoch)
    raise Interrupted(
        f"{name} received: training stopped during epoch {epoch + 1} of "
        f"{run.plan.settings.epochs}; {kept}.\n  Resume with: {run.plan.resume_command}",
        signum,
    )
