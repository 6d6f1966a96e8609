"""The epochs of a run, with small actions around their steps.

One object holds what they share, and what happens around the steps is a list of small
actions, as orbit's Controller runs its trainer and calls its Actions.

`EpochLoop.train_epoch(begin)` runs an epoch from its `Position` (a checkpoint's) in calls
of at most STEPS_PER_CALL steps, cut where a checkpoint is due (`checkpoints.Schedule`).
Before the epoch, every action in `EpochLoop.before_epoch` sees an `EpochStart` (the progress
display); after each call, every action in `EpochLoop.after_call` sees a `CallEnd` (the heartbeat,
the finite checks, the progress, a checkpoint when CHECKPOINT_EVERY's is due or a stop was
asked, then the stop); after the epoch, every action in `EpochLoop.after_epoch`
sees its record (history.json, the checkpoint, TensorBoard, the epoch line). Each action
is built with what it uses (`after_call_actions`, `after_epoch_actions`) and called with the
output alone; it raises to stop the run and returns nothing. The progress a user sees is
actions too (an epoch's start, each call, its end), not a second system beside them.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import RunFailed
from mgpu_env.config.parsers import CheckpointInterval
from mgpu_env.training.input.corrupt import stop_on_bad_records
from mgpu_env.training.input.data import Data
from mgpu_env.training.input.feeds import Feed
from mgpu_env.training.multiworker import WorkerSession
from mgpu_env.training.run import rundir
from mgpu_env.training.run.checkpoints import Checkpoints, SaveCost, Schedule
from mgpu_env.training.run.plan import TRAIN_SETTINGS
from mgpu_env.training.run.prepare import PreparedRun
from mgpu_env.training.run.progress import Progress
from mgpu_env.training.run.signals import Interrupted, StopRequest
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.build import Trainer
from mgpu_env.training.step.steps import StepFunctions


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
class EpochLoop:
    """What the epochs of one run share: the steps, the feed of the data, how many steps and
    epochs, how a stop is said, the epochs' records, and the actions around the steps."""

    trainer: Trainer
    data: Data  # its records' errors are named as they are met (`stop_on_bad_records`)
    feed: Feed
    steps_per_epoch: int
    global_batch_size: int
    start: Position  # the restored checkpoint's: where the first epoch begins
    stopping: Stopping
    schedule: Schedule  # where the calls end, and when a checkpoint inside an epoch is due
    history: list[dict[str, Any]] = field(default_factory=list)  # restored, then trained
    trained_samples: int = 0
    trained_seconds: float = 0.0
    before_epoch: list[BeforeEpoch] = field(default_factory=list)
    after_call: list[AfterCall] = field(default_factory=list)
    after_epoch: list[AfterEpoch] = field(default_factory=list)

    @property
    def start_epoch(self) -> int:
        return self.start.epoch

    def remaining(self) -> Iterator[Position]:
        """Where each epoch left begins (the first one where the checkpoint left it), each
        stopped first by a stop request received between them."""
        self.schedule.saved()  # a time's interval counts from training's start
        for epoch in range(self.start.epoch, self.stopping.epochs):
            begin = self.start if epoch == self.start.epoch else Position(epoch)
            if self.stopping.request.requested:
                raise_interrupted(self.stopping, begin, saved=True)
            yield begin

    def train_epoch(self, begin: Position) -> None:
        """One epoch from `begin` (a checkpoint's step of it, or its start), in the
        schedule's calls (at most STEPS_PER_CALL steps), then its record."""
        steps, per_epoch = self.trainer.steps, self.steps_per_epoch
        epoch, first = begin.epoch, begin.step
        run_steps = self.trainer.loops.runner(self.feed.source(begin))
        if not first:  # else the checkpoint restored the epoch's running metrics
            steps.reset_train_metrics()
        for told in self.before_epoch:
            told(EpochStart(epoch + 1, self.stopping.epochs, per_epoch))
        epoch_start = time.perf_counter()
        done = first
        while done < per_epoch:
            count = self.schedule.call_steps(Position(epoch, done))
            with stop_on_bad_records(self.data, ("train",), epoch, self.stopping.resume_command):
                run_steps(count)
            done += count
            call = CallEnd(epoch, done, float(steps.train_loss.result()),
                           float(steps.train_accuracy.result()))
            for action in self.after_call:
                action(call)
        seconds = time.perf_counter() - epoch_start
        # This process's steps: a resumed epoch's record times only the steps it trained.
        samples = (per_epoch - first) * self.global_batch_size
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
    prepared: PreparedRun, epochs: EpochLoop, test: tuple[float, float], wall_time_s: float,
    checkpoints: Checkpoints,
) -> dict[str, Any]:
    """metrics.json: the run's results (`test`: the test loss and accuracy), its plan, its
    settings, and what its checkpoints cost."""
    plan, data_plan = prepared.plan, prepared.data_plan
    described = plan.describe(data_plan)
    test_loss, test_accuracy = test
    return {
        "schema_version": rundir.SCHEMA_VERSION,
        "status": "finished",
        "epochs_completed": plan.settings.epochs,
        "resumed_from_epoch": epochs.start_epoch,
        "resumed_from_step": epochs.start.step,
        "replicas": plan.replicas,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "global_batch_size": plan.global_batch_size,
        "precision_policy": plan.precision.policy,
        "dataset": plan.dataset.name,
        "train_samples_per_sec": epochs.samples_per_sec(),
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "history": epochs.history,
        "training_time_s": epochs.trained_seconds,
        "wall_time_s": wall_time_s,
        "train_samples": data_plan.train_size,
        "test_samples": data_plan.test_size,
        "devices": described["devices"],
        "device_names": described["physical_devices"],
        "device_type": plan.device_type,
        "cross_device_ops": plan.strategy_plan.cross_device_ops,
        "xla": plan.xla,
        # What this start's checkpoints cost, at the interval asked (`every`).
        "checkpoint": {"every": str(epochs.schedule.interval), **checkpoints.describe_cost()},
        "settings": {
            k: v for k, v in plan.settings.describe().items() if k in TRAIN_SETTINGS
        },
        "mgpu_version": __version__,
    }


# --------------------------------------------------------------------- after each call


@dataclass(frozen=True)
class Saving:
    """What a checkpoint inside an epoch needs: the checkpoints, their schedule, how the
    workers agree on a save (`WorkerSession.agree`: as is on one process), what says it."""

    checkpoints: Checkpoints
    schedule: Schedule
    agree: Callable[[tuple[bool, ...]], tuple[bool, ...]]
    session: WorkerSession
    progress: Progress


def after_call_actions(
    steps: StepFunctions, progress: Progress, stopping: Stopping, saving: Saving,
    steps_per_epoch: int,
) -> list[AfterCall]:
    """The heartbeat, the finite checks, the progress, then a checkpoint when one is due or
    a stop was asked for (and the stop), in that order: weights never become a checkpoint
    before they are known finite."""

    def heartbeat(call: CallEnd) -> None:
        saving.session.progress()  # multi-worker: this worker is alive and training

    def loss_is_finite(call: CallEnd) -> None:
        if not math.isfinite(call.loss):
            raise_non_finite(stopping, call, f"The training loss became {call.loss}")

    def weights_are_finite(call: CallEnd) -> None:
        if not bool(steps.weights_finite()):
            raise_non_finite(stopping, call, "The model's weights became NaN or "
                             f"infinite (the loss reads {call.loss:.4f})")

    def show_progress(call: CallEnd) -> None:
        progress.steps_done(call.done, call.loss, call.accuracy)

    def checkpoint_or_stop(call: CallEnd) -> None:
        # At the epoch's end its own checkpoint is saved first; a stop then ends the run at
        # the next epoch's start.
        if call.done >= steps_per_epoch:
            return
        # Every worker saves (the save is collective) and stops at the same step.
        due, stop = saving.agree(
            (saving.schedule.due(Position(call.epoch, call.done)), stopping.request.requested)
        )
        if not (due or stop):
            return
        position = Position(call.epoch, call.done)
        saved = save_inside_epoch(saving, position, stopping if stop else None)
        if stop:
            raise_interrupted(stopping, position, saved)

    return [heartbeat, loss_is_finite, weights_are_finite, show_progress, checkpoint_or_stop]


# Seconds a save at a stop may take before the user is told it is still saving: Docker's
# stop waits 10 s before its SIGKILL, Slurm's --signal as long as asked.
STOP_SAVE_TOLD_AFTER_S = 5.0


def save_inside_epoch(saving: Saving, position: Position, stopping: Stopping | None) -> bool:
    """Save the checkpoint at `position`. At a stop (`stopping`), a save that takes over
    STOP_SAVE_TOLD_AFTER_S seconds is said to be under way (a SIGKILL then keeps the
    previous checkpoint: the index is written last), and one that fails is said and leaves
    the stop to go on; False then. Other saves that fail raise."""
    import threading

    saving.session.progress("saving the checkpoint")
    timer = None
    if stopping is not None:
        kept = saving.checkpoints.latest
        timer = threading.Timer(STOP_SAVE_TOLD_AFTER_S, lambda: print(
            f"{saving.session.tag}Still saving the checkpoint at {position.describe()} "
            f"after {STOP_SAVE_TOLD_AFTER_S:g} s; if the process is killed before it "
            f"finishes, the previous one is resumed ({kept or 'none: a fresh start'}).",
            file=sys.stderr, flush=True))
        timer.daemon = True
        timer.start()
    try:
        saving.checkpoints.save(position)
    except Exception as err:
        if stopping is None:
            raise
        print(f"{saving.session.tag}The checkpoint at {position.describe()} could not be "
              f"saved ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
              "the previous one is kept.", file=sys.stderr, flush=True)
        return False
    finally:
        if timer is not None:
            timer.cancel()
    saving.schedule.saved()
    saving.session.progress("training")
    return True


# -------------------------------------------------------------------- after each epoch


def after_epoch_actions(
    history: list[dict[str, Any]], saving: Saving, writer: Any, output_dir: Path | None,
) -> list[AfterEpoch]:
    """history.json (`output_dir`: the chief's run folder; None on the other workers), the
    checkpoint, TensorBoard's scalars, the epoch line and (once) what a checkpoint costs,
    in that order: history.json first, the checkpoint second, since on resume history is
    cut back to the checkpoint's epoch, so a kill between the two loses nothing."""
    progress = saving.progress

    def keep_history(record: dict[str, Any]) -> None:
        if output_dir is not None:
            rundir.write_history(output_dir, history)

    def save_checkpoint(record: dict[str, Any]) -> None:
        saving.session.progress("saving the checkpoint")
        saving.checkpoints.save(Position(record["epoch"]))
        saving.schedule.saved()
        saving.session.progress("training")

    def write_summaries(record: dict[str, Any]) -> None:
        import tensorflow as tf  # a no-op writer on the other workers

        with writer.as_default(step=record["epoch"]):
            for name in ("loss", "accuracy", "samples_per_sec"):
                tf.summary.scalar(name, record[name])
        writer.flush()

    told: list[bool] = []

    def tell_checkpoint_cost(record: dict[str, Any]) -> None:
        # Once, after the first epoch this start trained: the save just made is measured.
        if not told:
            told.append(True)
            progress.note(checkpoint_cost_line(saving.schedule.interval,
                                               saving.checkpoints.costs[-1]))

    return [keep_history, save_checkpoint, write_summaries, progress.epoch_end,
            tell_checkpoint_cost]


def checkpoint_cost_line(interval: CheckpointInterval, cost: SaveCost) -> str:
    """What one checkpoint took, at the interval chosen."""
    return f"Checkpoint: {cost.seconds:.2f} s and {cost.mb:.1f} MB each, {interval.describe()}"


def before_epoch_actions(progress: Progress) -> list[BeforeEpoch]:
    """The progress display's start of an epoch."""
    return [lambda start: progress.epoch_begin(start.epoch, start.epochs, start.steps)]


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


def raise_interrupted(stopping: Stopping, at: Position, saved: bool) -> None:
    """Stop the run where it stands (`at`); `saved`: whether a checkpoint is there (just
    saved, or, at an epoch's start, the one there), False when it could not be saved."""
    signum = stopping.request.signum or signal.SIGTERM
    name = signal.Signals(signum).name
    if saved and (at.step or at.epoch):
        kept = f"the checkpoint at {at.describe()} is saved"
    else:
        kept = "no step had been trained" if saved else rundir.checkpoint_kept(at.epoch)
    raise Interrupted(
        f"{name} received: training stopped during epoch {at.epoch + 1} of "
        f"{stopping.epochs}; {kept}.\n  Resume with: {stopping.resume_command}",
        signum,
    )
