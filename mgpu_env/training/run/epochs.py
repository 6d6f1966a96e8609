"""The epochs of a run: one object holds what they share, and what happens around the steps
is a list of small actions, as orbit's Controller runs its trainer and calls its Actions.

`Run.train_epoch(epoch)` runs an epoch in calls of at most STEPS_PER_CALL steps. Before the
epoch, every action in `Run.before_epoch` sees an `EpochStart` (the progress display); after
each call, every action in `Run.after_call` sees a `CallEnd` (the heartbeat, the finite
checks, the progress, a stop request); after the epoch, every action in `Run.after_epoch`
sees its record (history.json, the checkpoint, TensorBoard, the epoch line). Each action
is built with what it uses (`after_call_actions`, `after_epoch_actions`) and called with the
output alone; it raises to stop the run and returns nothing. The progress a user sees is
actions too (an epoch's start, each call, its end), not a second system beside them.
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
from mgpu_env.training.step.steps import StepFunctions


@dataclass
class Checkpoints:
    """The run's checkpoint, its manager and the epoch it counts."""

    checkpoint: Any
    manager: Any
    epoch: Any  # tf.Variable: epochs completed
    directory: Path


@dataclass(frozen=True)
class EpochStart:
    """An epoch about to start: which (1-based), of how many, in how many steps."""

    epoch: int
    epochs: int
    steps: int


@dataclass(frozen=True)
class CallEnd:
    """Where an epoch stands after one call of the compiled steps."""

    epoch: int  # counted from 0
    done: int  # steps of this epoch done so far
    loss: float
    accuracy: float


@dataclass(frozen=True)
class Stopping:
    """What a stop needs: the stop request its signals set, and what its messages name (the
    epochs asked for, the learning rate, the command that resumes)."""

    request: StopRequest
    epochs: int
    learning_rate: float
    resume_command: str


BeforeEpoch = Callable[[EpochStart], None]
AfterCall = Callable[[CallEnd], None]
AfterEpoch = Callable[[dict[str, Any]], None]


@dataclass
class Run:
    """What the epochs of one run share: the steps, the feed of the data, how many steps and
    epochs, how a stop is said, the epochs' records, and the actions around the steps."""

    trainer: Trainer
    data: Data  # its records' errors are named as they are met (`stop_on_bad_records`)
    feed: Feed
    steps_per_epoch: int
    global_batch_size: int
    start_epoch: int
    stopping: Stopping
    history: list[dict[str, Any]] = field(default_factory=list)  # restored, then trained
    trained_samples: int = 0
    trained_seconds: float = 0.0
    before_epoch: list[BeforeEpoch] = field(default_factory=list)
    after_call: list[AfterCall] = field(default_factory=list)
    after_epoch: list[AfterEpoch] = field(default_factory=list)

    def train(self) -> None:
        """The epochs left, each stopped first by a stop request received between them."""
        for epoch in range(self.start_epoch, self.stopping.epochs):
            if self.stopping.request.requested:
                raise_interrupted(self.stopping, epoch)
            self.train_epoch(epoch)

    def train_epoch(self, epoch: int) -> None:
        """One epoch, in calls of at most STEPS_PER_CALL steps, then its record."""
        steps, per_epoch = self.trainer.steps, self.steps_per_epoch
        run_steps = self.feed.runner(steps, epoch)
        steps.reset_train_metrics()
        for begin in self.before_epoch:
            begin(EpochStart(epoch + 1, self.stopping.epochs, per_epoch))
        epoch_start = time.perf_counter()
        done = 0
        while done < per_epoch:
            count = min(STEPS_PER_CALL, per_epoch - done)
            with stop_on_bad_records(self.data, ("train",), epoch, self.stopping.resume_command):
                run_steps(count)
            done += count
            call = CallEnd(epoch, done, float(steps.train_loss.result()),
                           float(steps.train_accuracy.result()))
            for action in self.after_call:
                action(call)
        seconds = time.perf_counter() - epoch_start
        samples = per_epoch * self.global_batch_size
        record = {"epoch": epoch + 1, "loss": call.loss, "accuracy": call.accuracy,
                  "samples_per_sec": samples / seconds, "seconds": seconds}
        self.trained_samples += samples
        self.trained_seconds += seconds
        self.history.append(record)
        for end in self.after_epoch:
            end(record)

    def samples_per_sec(self) -> float:
        """This process's training throughput; when it trained no epoch (it resumed a run
        killed after its last checkpoint), the mean of the epochs the history recorded."""
        if self.trained_seconds > 0:
            return self.trained_samples / self.trained_seconds
        rates = [float(e["samples_per_sec"]) for e in self.history if "samples_per_sec" in e]
        return sum(rates) / len(rates) if rates else 0.0


def run_metrics(
    plan: TrainPlan, data_plan: DataPlan, run: Run, test: tuple[float, float], wall_time_s: float
) -> dict[str, Any]:
    """metrics.json: the run's results (`test`: the test loss and accuracy), its plan and
    its settings."""
    described = plan.describe(data_plan)
    test_loss, test_accuracy = test
    return {
        "schema_version": rundir.SCHEMA_VERSION,
        "status": "finished",
        "epochs_completed": plan.settings.epochs,
        "resumed_from_epoch": run.start_epoch,
        "replicas": plan.replicas,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "global_batch_size": plan.global_batch_size,
        "precision_policy": plan.precision.policy,
        "dataset": plan.dataset.name,
        "train_samples_per_sec": run.samples_per_sec(),
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "history": run.history,
        "training_time_s": run.trained_seconds,
        "wall_time_s": wall_time_s,
        "train_samples": data_plan.train_size,
        "test_samples": data_plan.test_size,
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


# --------------------------------------------------------------------- after each call


def after_call_actions(
    session: WorkerSession, steps: StepFunctions, reporter: Reporter, stopping: Stopping,
    steps_per_epoch: int,
) -> list[AfterCall]:
    """The heartbeat, the finite checks, the progress and a stop request, in that order."""

    def heartbeat(call: CallEnd) -> None:
        session.progress()  # multi-worker: this worker is alive and training

    def loss_is_finite(call: CallEnd) -> None:
        if not math.isfinite(call.loss):
            raise_non_finite(stopping, call, f"The training loss became {call.loss}")

    def weights_are_finite(call: CallEnd) -> None:
        if not bool(steps.weights_finite()):
            raise_non_finite(stopping, call, "The model's weights became NaN or "
                             f"infinite (the loss reads {call.loss:.4f})")

    def show_progress(call: CallEnd) -> None:
        reporter.steps_done(call.done, call.loss, call.accuracy)

    def stop_if_requested(call: CallEnd) -> None:
        # Mid-epoch state is not saved: resuming restarts this epoch from the last completed
        # one, so a resumed run trains exactly like an uninterrupted one. (At the epoch's
        # end the checkpoint is saved first: the next epoch's start stops.)
        if stopping.request.requested and call.done < steps_per_epoch:
            raise_interrupted(stopping, call.epoch)

    return [heartbeat, loss_is_finite, weights_are_finite, show_progress, stop_if_requested]


# -------------------------------------------------------------------- after each epoch


def after_epoch_actions(
    history: list[dict[str, Any]], saved: Checkpoints, session: WorkerSession, writer: Any,
    reporter: Reporter, output_dir: Path | None,
) -> list[AfterEpoch]:
    """history.json (`output_dir`: the chief's run folder; None on the other workers), the
    checkpoint, TensorBoard's scalars and the epoch line, in that order: history.json first,
    the checkpoint second, since on resume history is cut back to the checkpoint's epoch, so
    a kill between the two loses nothing."""

    def keep_history(record: dict[str, Any]) -> None:
        if output_dir is not None:
            rundir.write_history(output_dir, history)

    def save_checkpoint(record: dict[str, Any]) -> None:
        saved.epoch.assign(record["epoch"])
        session.progress("saving the checkpoint")
        saved.manager.save(checkpoint_number=record["epoch"])
        session.progress("training")

    def write_summaries(record: dict[str, Any]) -> None:
        import tensorflow as tf  # a no-op writer on the other workers

        with writer.as_default(step=record["epoch"]):
            for name in ("loss", "accuracy", "samples_per_sec"):
                tf.summary.scalar(name, record[name])
        writer.flush()

    return [keep_history, save_checkpoint, write_summaries, reporter.epoch_end]


def before_epoch_actions(reporter: Reporter) -> list[BeforeEpoch]:
    """The progress display's start of an epoch."""
    return [lambda start: reporter.epoch_begin(start.epoch, start.epochs, start.steps)]


# ---------------------------------------------------------------------------- stopping


def raise_non_finite(stopping: Stopping, call: CallEnd, what: str) -> None:
    """Stop at once on a NaN or infinite loss, as Keras' TerminateOnNaN does, or on NaN or
    infinite weights: the weights are already non-finite, so this epoch is never saved and
    the last good checkpoint stays the one a new start resumes from."""
    kept = rundir.checkpoint_kept(call.epoch)
    raise RunFailed(
        f"{what} in epoch {call.epoch + 1} (within its first {call.done} "
        f"steps): training stopped and nothing of this epoch was saved; {kept}.\n"
        "  Cause: NaN or infinite values in streamed samples (data read whole is checked "
        f"before training), or a learning rate too high (LEARNING_RATE="
        f"{stopping.learning_rate}).\n"
        f"  Fix: repair the data and resume with: {stopping.resume_command}; or "
        "start over with a lower LEARNING_RATE in another OUTPUT_DIR."
    )


def raise_interrupted(stopping: Stopping, epoch: int) -> None:
    signum = stopping.request.signum or signal.SIGTERM
    name = signal.Signals(signum).name
    kept = rundir.checkpoint_kept(epoch)
    raise Interrupted(
        f"{name} received: training stopped during epoch {epoch + 1} of "
        f"{stopping.epochs}; {kept}.\n  Resume with: {stopping.resume_command}",
        signum,
    )
