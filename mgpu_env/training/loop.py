"""`mgpu train`'s loop: train as planned, checkpoint every epoch, write the outputs.

`run_training(plan, reporter)` trains and returns a `TrainResult`, or raises ConfigError
(exit 2), RunFailed (exit 1) or `Interrupted` (exit 128 + signal number).

Faults: a checkpoint is saved after every epoch (tf.train.CheckpointManager writes the
data files first and the `checkpoint` index file last, by rename, so a kill -9 mid-save
leaves the previous checkpoint the one referenced); starting again with the same
OUTPUT_DIR restores the latest one and continues from the next epoch. SIGTERM or SIGINT
stop training at the next step boundary (at most STEPS_PER_CALL steps), keep the last
completed epoch's checkpoint, and raise `Interrupted` with the command that resumes. A
non-finite loss, or a record that cannot be read (`training.corrupt`), stops with RunFailed.
"""

from __future__ import annotations

import math
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import ConfigError, RunFailed
from mgpu_env.hardware.tfimport import import_tensorflow
from mgpu_env.training import rundir
from mgpu_env.training.build import Trainer, build_trainer
from mgpu_env.training.corrupt import stop_on_bad_records
from mgpu_env.training.data import Data, load_data
from mgpu_env.training.feed import make_feed
from mgpu_env.training.multiworker import WorkerSession, agreement_values
from mgpu_env.training.order import STEPS_PER_CALL
from mgpu_env.training.plan import RUN_SETTINGS, TRAIN_SETTINGS, TrainPlan
from mgpu_env.training.report import Reporter
from mgpu_env.training.signals import Interrupted, StopRequest, stop_on_signals

CHECKPOINTS_KEPT = 3


@dataclass
class TrainResult:
    """What a run produced; `metrics` is what metrics.json holds."""

    output_dir: Path
    metrics: dict[str, Any]
    already_finished: bool = False

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


def resume_command(output_dir: Path) -> str:
    return f"OUTPUT_DIR={output_dir} mgpu train"


def run_training(
    plan: TrainPlan, reporter: Reporter | None = None, started: float | None = None
) -> TrainResult:
    """Train as planned; checkpoint every epoch; write the outputs when done. `started`
    (`time.time()`): when the command started, the start of the wall time (default: now).

    Raises ConfigError (bad data, an unreadable checkpoint), RunFailed (TensorFlow failed)
    or Interrupted (a signal stopped the run; the command to resume is in the message).
    """
    reporter = reporter or Reporter()
    started = time.time() if started is None else started
    # A multi-worker run goes on even when finished: the chief's state decides for all.
    if plan.strategy.role.num_workers == 1 and plan.folder.finished_metrics is not None and (
        plan.folder.finished_metrics.get("epochs_completed") == plan.settings.epochs
    ):
        return TrainResult(plan.output_dir, plan.folder.finished_metrics, already_finished=True)
    stop = StopRequest()
    multi_worker = plan.strategy.kind == "multi_worker"
    session = WorkerSession(
        plan.runtime.cluster if multi_worker else None, plan.settings.worker_timeout
    )
    with stop_on_signals(stop):
        try:
            result = _train(plan, reporter, stop, started, session)
            session.close(succeeded=True)
            return result
        except (ConfigError, RunFailed):
            raise
        except KeyboardInterrupt:
            # A second Ctrl-C stops at once, even mid-save: the `checkpoint` index file is
            # replaced last, so the previous checkpoint stays the one that is resumed.
            raise Interrupted(
                "SIGINT received twice: training stopped at once; the last checkpoint "
                f"written is kept.\n  Resume with: {resume_command(plan.output_dir)}",
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
                    f"{resume_command(plan.output_dir)} (run with --debug for the traceback)"
                ) from err
            raise
        finally:
            session.close(succeeded=False)


@dataclass
class _Checkpoints:
    """The run's checkpoint, its manager and the epoch it counts."""

    checkpoint: Any
    manager: Any
    epoch: Any  # tf.Variable: epochs completed
    directory: Path


def _start(plan: TrainPlan, session: WorkerSession, arrays: Data) -> Trainer:
    """TensorFlow's devices and precision, the strategy, then model, optimizer and steps."""
    from mgpu_env.runtime.keras import tensorflow_keras
    from mgpu_env.training.model import model_builder

    execution = plan.runtime.execution
    execution.prepare_tensorflow()
    tensorflow_keras().utils.set_random_seed(plan.settings.seed)
    session.join()
    strategy = execution.make_strategy()
    session.after_strategy(strategy, agreement_values(
        plan.settings, plan.chosen, local_replicas=plan.strategy.local_replicas,
        train_samples=arrays.train_size, steps_per_epoch=plan.steps_per_epoch,
    ))
    return build_trainer(
        strategy,
        # MODEL: the tutorial's MLP, or the user's builder (checked against the data's shape).
        model_builder(plan.model, plan.settings.seed, plan.input_shape, plan.num_classes),
        learning_rate=plan.settings.learning_rate, precision=plan.precision,
        global_batch_size=plan.global_batch_size, jit_compile=plan.xla,
    )


def _restore_checkpoints(
    plan: TrainPlan, trainer: Trainer, session: WorkerSession
) -> tuple[_Checkpoints, int]:
    """Claim the run folder (chief), restore the latest checkpoint; the epoch to start at."""
    import tensorflow as tf

    with trainer.strategy.scope():
        epoch_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    if plan.strategy.role.is_chief:
        rundir.claim_run_folder(plan.folder, plan.identity)
        directory = plan.folder.checkpoint_dir
    else:
        # Every worker must take part in saving (the save is collective); only the chief's
        # copy is kept. The others save to a scratch folder, deleted at the end.
        directory = session.checkpoint_dir(plan.folder.checkpoint_dir)
    checkpoint = tf.train.Checkpoint(
        model=trainer.model, optimizer=trainer.optimizer, epoch=epoch_counter
    )
    manager = tf.train.CheckpointManager(
        checkpoint, str(directory), max_to_keep=CHECKPOINTS_KEPT, checkpoint_name="ckpt",
    )
    _restore(checkpoint, manager, epoch_counter)
    # Multi-worker: the chief's checkpoint is the truth; the others receive its values, so
    # they need no shared folder (and resume from the same epoch).
    session.share_restored(
        trainer.strategy,
        [*trainer.model.variables, *trainer.optimizer.variables, epoch_counter],
    )
    return _Checkpoints(checkpoint, manager, epoch_counter, directory), int(
        epoch_counter.numpy()
    )


def _train(
    plan: TrainPlan, reporter: Reporter, stop: StopRequest, started: float,
    session: WorkerSession,
) -> TrainResult:
    tf = import_tensorflow()  # the first import in a fresh run: quiet on a healthy start

    # Iterating a distributed dataset inside tf.function reads its options in graph mode;
    # TensorFlow warns about that on every run, and it changes nothing here.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")

    settings = plan.settings
    is_chief = plan.strategy.role.is_chief
    arrays = load_data(plan.dataset, settings.seed)
    _check_sizes(plan, arrays)
    trainer = _start(plan, session, arrays)
    saved, start_epoch = _restore_checkpoints(plan, trainer, session)
    if is_chief:
        # What this start ran with, and why (flag, env, .env, default), before any epoch.
        rundir.atomic_write_json(plan.output_dir / rundir.SETTINGS_FILE, {
            "schema_version": rundir.SCHEMA_VERSION,
            "mgpu_version": __version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "resumed_from_epoch": start_epoch,
            "settings": plan.settings_provenance(RUN_SETTINGS),
        })
    history = rundir.read_history(plan.output_dir, start_epoch) if start_epoch else []
    if start_epoch:
        reporter.note(f"Resuming from the checkpoint of epoch {start_epoch} in {saved.directory}")

    writer = tf.summary.create_file_writer(str(plan.output_dir / rundir.LOG_DIR)) if (
        is_chief
    ) else tf.summary.create_noop_writer()
    history, trained_samples, trained_seconds = _train_epochs(
        plan, trainer, saved, session, reporter, stop, writer, start_epoch, history, arrays
    )
    if stop.requested and plan.settings.epochs > start_epoch:
        # The signal came during the last epoch's save: everything is saved, so finish.
        reporter.note("Stop requested after the last epoch was saved; finishing the run")

    test_loss, test_accuracy = _evaluate(plan, trainer, session, arrays)
    with writer.as_default(step=settings.epochs):
        tf.summary.scalar("test_accuracy", test_accuracy)
    writer.flush()

    metrics = _metrics(
        plan, start_epoch, history, test_accuracy, test_loss,
        trained_samples, trained_seconds, time.time() - started, arrays,
    )
    finished_before = plan.folder.finished_metrics
    if start_epoch == settings.epochs and finished_before is not None:
        # A multi-worker restart of a finished run (the workers still evaluated together):
        # keep the chief's results rather than replace them with a run of no epochs.
        return TrainResult(plan.output_dir, finished_before, already_finished=True)
    if is_chief:
        rundir.atomic_save(
            plan.output_dir / rundir.MODEL_FILE, lambda path: trainer.model.save(path),
            ".keras",
        )
        rundir.atomic_write_json(plan.output_dir / rundir.METRICS_FILE, metrics)
    return TrainResult(plan.output_dir, metrics)


def _train_epochs(
    plan: TrainPlan, trainer: Trainer, saved: _Checkpoints, session: WorkerSession,
    reporter: Reporter, stop: StopRequest, writer: Any, start_epoch: int,
    history: list[dict[str, Any]], arrays: Data,
) -> tuple[list[dict[str, Any]], int, float]:
    """The epochs left; each ends with its history entry, checkpoint and TensorBoard
    scalars. Returns the history and this process's trained samples and seconds."""
    import tensorflow as tf

    settings, steps = plan.settings, trainer.steps
    trained_samples, trained_seconds = 0, 0.0
    samples_per_epoch = plan.steps_per_epoch * plan.global_batch_size
    resume = resume_command(plan.output_dir)
    with stop_on_bad_records(arrays, ("train", "test"), start_epoch, resume):  # read if kept
        feed = make_feed(trainer.strategy, arrays, plan.global_batch_size, settings.seed,
                         deterministic=settings.data_deterministic, keep=plan.keep)
    for epoch in range(start_epoch, settings.epochs):
        if stop.requested:
            _raise_interrupted(plan, stop, epoch)
        run_steps = feed.runner(steps, epoch)
        steps.reset_train_metrics()
        reporter.epoch_begin(epoch + 1, settings.epochs, plan.steps_per_epoch)
        epoch_start = time.perf_counter()
        done = 0
        while done < plan.steps_per_epoch:
            count = min(STEPS_PER_CALL, plan.steps_per_epoch - done)
            with stop_on_bad_records(arrays, ("train",), epoch, resume):
                run_steps(count)
            session.progress()
            done += count
            loss = float(steps.train_loss.result())
            accuracy = float(steps.train_accuracy.result())
            if not math.isfinite(loss):
                _raise_non_finite(plan, epoch, done, f"The training loss became {loss}")
            if not bool(steps.weights_finite()):
                _raise_non_finite(plan, epoch, done, "The model's weights became NaN or "
                                  f"infinite (the loss reads {loss:.4f})")
            reporter.steps_done(done, loss, accuracy)
            if stop.requested and done < plan.steps_per_epoch:
                # Mid-epoch state is not saved: resuming restarts this epoch from the last
                # completed one, so a resumed run trains exactly like an uninterrupted one.
                _raise_interrupted(plan, stop, epoch)
        seconds = time.perf_counter() - epoch_start
        trained_samples += samples_per_epoch
        trained_seconds += seconds
        record = {
            "epoch": epoch + 1,
            "loss": loss,
            "accuracy": accuracy,
            "samples_per_sec": samples_per_epoch / seconds,
            "seconds": seconds,
        }
        history = [*history, record]
        if plan.strategy.role.is_chief:
            # history.json first, the checkpoint second: on resume, history is cut back to
            # the checkpoint's epoch, so a kill between the two loses nothing.
            rundir.write_history(plan.output_dir, history)
        saved.epoch.assign(epoch + 1)
        session.progress("saving the checkpoint")
        saved.manager.save(checkpoint_number=epoch + 1)
        session.progress("training")
        with writer.as_default(step=epoch + 1):
            for name in ("loss", "accuracy", "samples_per_sec"):
                tf.summary.scalar(name, record[name])
        writer.flush()
        reporter.epoch_end(record)
    return history, trained_samples, trained_seconds


def _evaluate(
    plan: TrainPlan, trainer: Trainer, session: WorkerSession, arrays: Data
) -> tuple[float, float]:
    """Loss and accuracy on the whole test set (the partial last batch included)."""
    from mgpu_env.training.data import test_dataset

    steps = trainer.steps
    steps.test_loss.reset_state()
    steps.test_accuracy.reset_state()
    session.progress("evaluating")
    with stop_on_bad_records(arrays, ("test",), None, resume_command(plan.output_dir)):
        steps.evaluate(trainer.strategy.experimental_distribute_dataset(
            test_dataset(arrays, plan.global_batch_size)
        ))
    return float(steps.test_loss.result()), float(steps.test_accuracy.result())


def _samples_per_sec(samples: int, seconds: float, history: list[dict[str, Any]]) -> float:
    """This process's training throughput; when it trained no epoch (it resumed a run killed
    after its last checkpoint), the mean of the epochs the history recorded."""
    if seconds > 0:
        return samples / seconds
    rates = [float(e["samples_per_sec"]) for e in history if "samples_per_sec" in e]
    return sum(rates) / len(rates) if rates else 0.0


def _check_sizes(plan: TrainPlan, arrays: Data) -> None:
    # The plan (and the run's identity, and the dry run) use the official sizes; a file of
    # another size is some other data set under a known name, so it is refused.
    if (arrays.train_size, arrays.test_size) != (plan.train_size, plan.test_size):
        raise ConfigError(
            f"{plan.dataset.describe()} has {arrays.train_size} training and "
            f"{arrays.test_size} test samples; {plan.dataset.name} has {plan.train_size} and "
            f"{plan.test_size}.\n  Fix: replace the file with the official one."
        )


def _restore(checkpoint: Any, manager: Any, epoch_counter: Any) -> int:
    """Restore the latest checkpoint, checking it matches the model; return its epoch.

    A checkpoint that cannot be restored is an error, never a silent fresh start that would
    overwrite it.
    """
    latest = manager.latest_checkpoint
    if latest is None:
        return 0
    try:
        checkpoint.restore(latest).assert_existing_objects_matched()
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"The checkpoint {latest} cannot be restored ({type(err).__name__}: {first}).\n"
            f"  Fix: move {Path(latest).parent} away to start over, or choose another OUTPUT_DIR."
        ) from None
    return int(epoch_counter.numpy())


def _raise_non_finite(plan: TrainPlan, epoch: int, done: int, what: str) -> None:
    """Stop at once on a NaN or infinite loss, as Keras' TerminateOnNaN does, or on NaN or
    infinite weights: the weights are already non-finite, so this epoch is never saved and
    the last good checkpoint stays the one a new start resumes from."""
    kept = rundir.checkpoint_kept(epoch)
    raise RunFailed(
        f"{what} in epoch {epoch + 1} (within its first {done} "
        f"steps): training stopped and nothing of this epoch was saved; {kept}.\n"
        "  Cause: NaN or infinite values in streamed samples (data read whole is checked "
        f"before training), or a learning rate too high (LEARNING_RATE="
        f"{plan.settings.learning_rate}).\n"
        f"  Fix: repair the data and resume with: {resume_command(plan.output_dir)}; or "
        "start over with a lower LEARNING_RATE in another OUTPUT_DIR."
    )


def _raise_interrupted(plan: TrainPlan, stop: StopRequest, epoch: int) -> None:
    signum = stop.signum or signal.SIGTERM
    name = signal.Signals(signum).name
    kept = rundir.checkpoint_kept(epoch)
    raise Interrupted(
        f"{name} received: training stopped during epoch {epoch + 1} of "
        f"{plan.settings.epochs}; {kept}.\n  Resume with: {resume_command(plan.output_dir)}",
        signum,
    )


def _metrics(
    plan: TrainPlan,
    start_epoch: int,
    history: list[dict[str, Any]],
    test_accuracy: float,
    test_loss: float,
    trained_samples: int,
    trained_seconds: float,
    wall_time_s: float,
    arrays: Data,
) -> dict[str, Any]:
    described = plan.describe()
    return {
        "schema_version": rundir.SCHEMA_VERSION,
        "status": "finished",
        "epochs_completed": plan.settings.epochs,
        "resumed_from_epoch": start_epoch,
        "replicas": plan.replicas,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "global_batch_size": plan.global_batch_size,
        "precision_policy": plan.precision.policy,
        "dataset": plan.dataset.name,
        "train_samples_per_sec": _samples_per_sec(trained_samples, trained_seconds, history),
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "history": history,
        "training_time_s": trained_seconds,
        "wall_time_s": wall_time_s,
        "train_samples": arrays.train_size,
        "test_samples": arrays.test_size,
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
