"""The stages of `mgpu train` that `trainer.run_plan` runs, in its order.

They are the stall watch and the failures said (`failures_said`), the trainer started
(`start_trainer`: strategy, model, optimizer, steps), the checkpoint restored
(`restore_checkpoints`), this start recorded (`record_start`), the feed opened
(`open_feed`), the epochs with their actions (`epoch_loop`), and the run finished (`finish`:
evaluation, model, metrics.json).

Faults: a checkpoint is saved after every epoch, and inside epochs as CHECKPOINT_EVERY asks,
with the data's position (`run.checkpoints`: tf.train.CheckpointManager writes the data files
first and the `checkpoint` index file last, by rename, so a kill -9 mid-save leaves the
previous checkpoint the one referenced); starting again with the same OUTPUT_DIR restores
the latest one and continues from its step. SIGTERM or SIGINT stop training at the next
call's end (at most STEPS_PER_CALL steps), save a checkpoint there, and raise `Interrupted`
with the command that resumes. A non-finite loss, or a record that cannot be read
(`training.input.corrupt`), stops with RunFailed.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import ConfigError, RunFailed
from mgpu_env.tfprobes.tfimport import import_tensorflow
from mgpu_env.training.input.corrupt import stop_on_bad_records
from mgpu_env.training.input.data import Data
from mgpu_env.training.input.feeds import Feed, FeedMaking, make_feed
from mgpu_env.training.multiworker import WorkerSession, agreement_values
from mgpu_env.training.multiworker.session import stall_watch as worker_stall_watch
from mgpu_env.training.multiworker.stall import StallWatch
from mgpu_env.training.multiworker.stallhints import STARTING, Devices
from mgpu_env.training.run import rundir
from mgpu_env.training.run.checkpoints import (
    Checkpoints,
    Schedule,
    checkpoint_plan_line,
)
from mgpu_env.training.run.epochs import (
    EpochLoop,
    Saving,
    Stopping,
    after_call_actions,
    after_epoch_actions,
    before_epoch_actions,
    run_metrics,
)
from mgpu_env.training.run.finished import FinishedRun
from mgpu_env.training.run.memcheck import FirstPeak, memory_record
from mgpu_env.training.run.plan import RUN_SETTINGS, TrainPlan
from mgpu_env.training.run.prepare import PreparedRun
from mgpu_env.training.run.progress import Progress
from mgpu_env.training.run.signals import Interrupted, StopRequest
from mgpu_env.training.run.state import (
    DamagedRunFolder,
    checkpoints_on_disk,
    newest_good,
)
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.build import Trainer, build_trainer
from mgpu_env.training.step.steps import StepSpec


@dataclass
class TrainResult:
    """What a run produced; `metrics` is what metrics.json holds. `finished`: the run its
    folder held finished already (nothing was trained; `metrics` are that run's)."""

    output_dir: Path
    metrics: dict[str, Any]
    finished: FinishedRun | None = None

    @classmethod
    def nothing_to_do(cls, finished: FinishedRun) -> TrainResult:
        return cls(finished.output_dir, finished.metrics, finished)

    @property
    def already_finished(self) -> bool:
        return self.finished is not None

    @property
    def test_accuracy(self) -> float:
        return float(self.metrics["test_accuracy"])

    @property
    def train_samples_per_sec(self) -> float:
        return float(self.metrics["train_samples_per_sec"])

    @property
    def training_time_s(self) -> float:
        """The epochs' time: the seconds this run spent in the epochs it trained."""
        return float(self.metrics.get("training_time_s", 0.0))

    @property
    def wall_time_s(self) -> float:
        """Wall time, start-up included: from the command's start to the run's end."""
        return float(self.metrics["wall_time_s"])


@contextlib.contextmanager
def failures_said(plan: TrainPlan, session: WorkerSession) -> Iterator[None]:
    """What a run's failure says: ConfigError and RunFailed as raised; a second Ctrl-C as
    `Interrupted`; a worker lost (`session.failure`) or TensorFlow's own error as RunFailed
    with the command that resumes. The session is closed either way."""
    try:
        yield
        session.close(succeeded=True)
    except (ConfigError, RunFailed):
        raise
    except KeyboardInterrupt:
        # A second Ctrl-C stops at once, even mid-save: the `checkpoint` index file is
        # replaced last, so the previous checkpoint stays the one that is resumed.
        raise Interrupted(
            "SIGINT received twice: training stopped at once; the last checkpoint "
            f"written is kept.\n  Resume with: {plan.resume_command}",
            signal.SIGINT,
        ) from None
    except Exception as err:
        lost = session.failure(err)
        if lost is not None:
            raise RunFailed(lost) from err
        if type(err).__module__.startswith("tensorflow"):
            raise RunFailed(
                f"TensorFlow failed: {type(err).__name__}: {str(err).splitlines()[0]}\n"
                f"  Completed epochs are checkpointed; resume with: "
                f"{plan.resume_command} (run with --debug for the traceback)"
            ) from err
        raise
    finally:
        session.close(succeeded=False)


def worker_session(plan: TrainPlan) -> WorkerSession:
    """This process's worker session, the cluster's or one process's, with its stall watch
    (a worker's phases are capped by WORKER_TIMEOUT too: each waits on the others)."""
    multi_worker = plan.strategy_plan.kind == "multi_worker"
    return WorkerSession(
        plan.runtime.cluster if multi_worker else None, plan.settings.worker_timeout,
        stall=stall_watch(plan),
    )


def stall_watch(plan: TrainPlan) -> StallWatch:
    """This run's stall watch (STALL_TIMEOUT), in its first phase."""
    import os

    strategy_plan = plan.strategy_plan
    multi_worker = strategy_plan.kind == "multi_worker"
    watch = worker_stall_watch(plan.settings.stall_timeout, Devices(
        plan.replicas, strategy_plan.device_type, strategy_plan.cross_device_ops,
        {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        strategy_plan.role.num_workers,
    ), plan.resume_command, plan.runtime.cluster if multi_worker else None,
        plan.settings.worker_timeout)
    watch.phase(STARTING)
    return watch


def start_trainer(prepared: PreparedRun, session: WorkerSession) -> Trainer:
    """The strategy (TensorFlow's devices and precision are prepared), then model,
    optimizer and steps."""
    from mgpu_env.runtime.keras import tensorflow_keras
    from mgpu_env.training.step.model import model_builder

    plan, shape = prepared.plan, prepared.data_plan
    tensorflow_keras().utils.set_random_seed(plan.settings.seed)
    session.join()
    strategy = plan.runtime.execution.make_strategy()
    session.after_strategy(strategy, agreement_values(
        plan.settings, plan.chosen, local_replicas=plan.strategy_plan.local_replicas,
        train_samples=shape.train_size, steps_per_epoch=shape.steps_per_epoch,
    ))
    return build_trainer(
        strategy,
        # MODEL: the tutorial's MLP, or the user's builder (checked against the data's shape).
        model_builder(plan.model, plan.settings.seed, shape.input_shape, shape.num_classes),
        StepSpec(learning_rate=plan.settings.learning_rate, precision=plan.precision,
                 global_batch_size=plan.global_batch_size, jit_compile=plan.xla),
    )


def restore_checkpoints(
    plan: TrainPlan, trainer: Trainer, session: WorkerSession, data: dict[str, Any]
) -> tuple[Checkpoints, Position]:
    """Claim the run folder (chief), restore the latest checkpoint; where to start."""
    if plan.is_chief:
        rundir.claim_run_folder(plan.folder, plan.identity, data)
        directory = plan.folder.checkpoint_dir
    else:
        # Every worker must take part in saving (the save is collective); only the chief's
        # copy is kept. The others save to a scratch folder, deleted at the end.
        directory = session.checkpoint_dir(plan.folder.checkpoint_dir)
    checkpoints = Checkpoints(trainer, directory)
    _restore(checkpoints)
    # Multi-worker: the chief's checkpoint is the truth; the others receive its values, so
    # they need no shared folder (and resume from the same position).
    session.share_restored(trainer.strategy, checkpoints.shared_variables())
    checkpoints.restore_metrics()
    return checkpoints, checkpoints.position()


@dataclass(frozen=True)
class Start:
    """This start of the run: when the command started (the wall time's start), what
    shows its progress, the stop request its signals set, and its worker session."""

    started: float
    progress: Progress
    stop: StopRequest
    session: WorkerSession


def record_start(prepared: PreparedRun, start: Start, saved: Checkpoints, position: Position
                 ) -> None:
    """settings.json (the chief's): what this start ran with, and why (flag, env, .env,
    default), before any epoch; then where it resumes and how it checkpoints, said."""
    plan = prepared.plan
    if plan.is_chief:
        rundir.atomic_write_json(plan.output_dir / rundir.SETTINGS_FILE, {
            "schema_version": rundir.SCHEMA_VERSION,
            "mgpu_version": __version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start.started)),
            "resumed_from_epoch": position.epoch,
            "resumed_from_step": position.step,
            **({"run_id": run_id} if (run_id := rundir.run_id_of(plan.output_dir)) else {}),
            "settings": plan.settings_provenance(RUN_SETTINGS),
        })
    if position.epoch or position.step:
        inside = f" and {position.step} steps ({position.describe()})" if position.step else ""
        start.progress.note(f"Resuming from the checkpoint of epoch {position.epoch}{inside} "
                            f"in {saved.directory}")
    start.progress.note(checkpoint_plan_line(plan.settings.checkpoint_every, saved))


def open_feed(prepared: PreparedRun, trainer: Trainer, position: Position) -> Feed:
    """The feed the plan names, over the prepared data: data kept on the devices is read
    (and checked) here, once."""
    import warnings

    # Iterating a distributed dataset inside tf.function reads its options in graph mode;
    # TensorFlow warns about that on every run, and it changes nothing here.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
    plan, settings = prepared.plan, prepared.plan.settings
    with stop_on_bad_records(prepared.data, ("train", "test"), position.epoch,
                             plan.resume_command):
        return make_feed(FeedMaking(trainer.strategy, prepared.data, prepared.data_plan.feed,
                                    plan.global_batch_size, settings.seed,
                                    deterministic=settings.data_deterministic))


def profile_steps(prepared: PreparedRun, trainer: Trainer, progress: Progress) -> None:
    """PROFILE=STEPS: those steps traced before training (off, nothing of the profiler is
    imported)."""
    from mgpu_env.profile.steps import profile_training

    plan = prepared.plan
    for line in profile_training(trainer, plan.output_dir / rundir.LOG_DIR,
                                 plan.settings.profile, prepared.data, plan.global_batch_size):
        progress.note(line)


@dataclass(frozen=True)
class Outputs:
    """What the run writes with: the model's trainer, its checkpoints, TensorBoard's writer,
    and each GPU's memory peak after the first call (metrics.json's, beside the estimate)."""

    trainer: Trainer
    saved: Checkpoints
    writer: Any  # tf.summary writer (a no-op one on a worker that is not the chief)
    peak: FirstPeak

    @classmethod
    def of(cls, plan: TrainPlan, trainer: Trainer, saved: Checkpoints) -> Outputs:
        tf = import_tensorflow()  # imported (quietly) by `prepare`: the module
        writer = (tf.summary.create_file_writer(str(plan.output_dir / rundir.LOG_DIR))
                  if plan.is_chief else tf.summary.create_noop_writer())
        return cls(trainer, saved, writer, FirstPeak(trainer.strategy.extended.worker_devices))


def epoch_loop(
    prepared: PreparedRun, start: Start, outputs: Outputs, feed: Feed, position: Position
) -> EpochLoop:
    """The epochs to train, with the actions around their steps, each given what it uses."""
    plan, progress = prepared.plan, start.progress
    stopping = Stopping(start.stop, plan.settings.epochs, plan.settings.learning_rate,
                        plan.resume_command)
    history = rundir.read_history(plan.output_dir, position.epoch) if position.epoch else []
    per_epoch = prepared.data_plan.steps_per_epoch
    strategy = outputs.trainer.strategy
    saving = Saving(
        outputs.saved, Schedule(plan.settings.checkpoint_every, per_epoch),
        lambda flags: start.session.agree(strategy, flags), start.session, progress,
    )
    return EpochLoop(
        outputs.trainer, prepared.data, feed, per_epoch, plan.global_batch_size, position,
        stopping, saving.schedule, history,
        before_epoch=before_epoch_actions(progress),
        after_call=[outputs.peak, *after_call_actions(outputs.trainer.steps, progress,
                                                      stopping, saving, per_epoch)],
        after_epoch=after_epoch_actions(history, saving, outputs.writer,
                                        plan.output_dir if plan.is_chief else None),
    )


def finish(
    prepared: PreparedRun, epochs: EpochLoop, outputs: Outputs, start: Start
) -> TrainResult:
    """Evaluate on the test set, then (chief) write the model and metrics.json."""
    import tensorflow as tf

    plan = prepared.plan
    test = _evaluate(plan, outputs.trainer, start.session, prepared.data)
    with outputs.writer.as_default(step=plan.settings.epochs):
        tf.summary.scalar("test_accuracy", test[1])
    outputs.writer.flush()
    metrics = run_metrics(prepared, epochs, test, time.time() - start.started, outputs.saved)
    metrics["memory"] = memory_record(prepared.memory, outputs.peak)
    if (run_id := rundir.run_id_of(plan.output_dir)) is not None:
        metrics["run_id"] = run_id  # so a metrics.json of another run is seen (`state`)
    if epochs.start_epoch == plan.settings.epochs and plan.finished is not None:
        # A multi-worker restart of a finished run (the workers still evaluated together):
        # keep the chief's results rather than replace them with a run of no epochs.
        return TrainResult.nothing_to_do(plan.finished)
    if plan.is_chief:
        rundir.atomic_save(
            plan.output_dir / rundir.MODEL_FILE, lambda path: outputs.trainer.model.save(path),
            ".keras",
        )
        rundir.atomic_write_json(plan.output_dir / rundir.METRICS_FILE, metrics)
    return TrainResult(plan.output_dir, metrics)


def _evaluate(
    plan: TrainPlan, trainer: Trainer, session: WorkerSession, arrays: Data
) -> tuple[float, float]:
    """Loss and accuracy on the whole test set (the partial last batch included)."""
    from mgpu_env.training.input.data import test_dataset

    steps = trainer.steps
    steps.test_loss.reset_state()
    steps.test_accuracy.reset_state()
    session.progress("evaluating")
    with stop_on_bad_records(arrays, ("test",), None, plan.resume_command):
        steps.evaluate(trainer.strategy.experimental_distribute_dataset(
            test_dataset(arrays, plan.global_batch_size)
        ))
    return float(steps.test_loss.result()), float(steps.test_accuracy.result())


def _restore(checkpoints: Checkpoints) -> None:
    """Restore the latest checkpoint, checking it matches the model.

    A checkpoint that cannot be restored (bytes TensorFlow's checksums refuse, another
    model's) is refused with the newest complete one before it and the command that
    resumes from that (`state.DamagedRunFolder`), never a silent fresh start over it.
    """
    latest = checkpoints.latest
    try:
        checkpoints.restore()
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        name = Path(str(latest)).name
        failed = Position.parse(name)
        good = newest_good(checkpoints_on_disk(checkpoints.directory), failed)
        raise DamagedRunFolder(
            checkpoints.directory.parent, f"{checkpoints.directory.name}/{name}",
            f"cannot be restored ({type(err).__name__}: {first})", good,
        ) from None
