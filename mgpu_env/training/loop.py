"""`mgpu train`: plan a run from settings and devices, then train, checkpoint and report.

Two public steps, both used by the thin CLI:
- `plan_training(launch)` resolves everything (devices, replicas, batches, precision, the
  all-reduce, the data set, the output folder and whether it resumes) and writes nothing;
  `--dry-run` prints it and stops.
- `run_training(plan, reporter)` trains and returns a `TrainResult`, or raises ConfigError
  (exit 2), RunFailed (exit 1) or `Interrupted` (exit 128 + signal number).

Faults: a checkpoint is saved after every epoch (tf.train.CheckpointManager writes the
data files first and the `checkpoint` index file last, by rename, so a kill -9 mid-save
leaves the previous checkpoint the one referenced); starting again with the same
OUTPUT_DIR restores the latest one and continues from the next epoch. SIGTERM or SIGINT
stop training at the next step boundary (at most STEPS_PER_CALL steps), keep the last
completed epoch's checkpoint, and raise `Interrupted` with the command that resumes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import ConfigError, RunFailed
from mgpu_env.config.settings import Settings
from mgpu_env.hardware.devices import LogicalDevices
from mgpu_env.runtime import Launch
from mgpu_env.training import rundir
from mgpu_env.training.data import (
    Arrays,
    DatasetChoice,
    load_arrays,
    resolve_dataset,
)
from mgpu_env.training.multiworker import WorkerSession, agreement_values, resolve_cluster
from mgpu_env.training.precision import PrecisionChoice, choose_precision
from mgpu_env.training.strategy import StrategyPlan, nccl_possible, plan_strategy

# Steps run per tf.function call: Python (and a signal check) runs once per call.
STEPS_PER_CALL = 200
CHECKPOINTS_KEPT = 3
# The settings `mgpu train` reads (the others belong to other commands, or to the
# cluster), for the "defaults" line of the summary and the settings in metrics.json.
TRAIN_SETTINGS = (
    "GPUS", "MIXED_PRECISION", "EPOCHS", "BATCH_SIZE", "LEARNING_RATE", "DATASET", "DATA_DIR",
    "OUTPUT_DIR", "RUN_NAME", "VIRTUAL_DEVICES", "XLA", "CROSS_DEVICE_OPS", "SEED", "QUIET",
)
# Known sizes, so a dry run need not read (or download) the data. Digits: 1797 samples,
# 20% held out by a stratified split.
KNOWN_SIZES = {
    "mnist": (60_000, 10_000),
    "fashion_mnist": (60_000, 10_000),
    "synthetic": (60_000, 10_000),
    "digits": (1437, 360),
}


class Interrupted(RunFailed):
    """SIGTERM/SIGINT stopped training; the last completed epoch's checkpoint is kept.

    Exit code 128 + the signal number (143 for SIGTERM, 130 for SIGINT), the shell's and
    Docker's convention for "terminated by a signal": a wrapper or scheduler can tell a
    resumable interruption from a failure (1) or a bad configuration (2).
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class TrainPlan:
    """Everything a run will do, resolved before any training starts."""

    settings: Settings
    defaulted: tuple[str, ...]
    device_type: str  # "GPU" or "CPU"
    device_names: tuple[str, ...]  # GPU names or "CPU", one per physical device
    strategy: StrategyPlan
    precision: PrecisionChoice
    dataset: DatasetChoice
    train_size: int
    test_size: int
    per_replica_batch_size: int
    global_batch_size: int
    steps_per_epoch: int
    xla: bool
    output_dir: Path
    folder: rundir.RunFolder
    resume_epoch: int  # epochs already completed in output_dir (0 for a fresh run)
    notes: tuple[str, ...] = ()

    @property
    def replicas(self) -> int:
        """All replicas: local ones times the number of workers."""
        return self.strategy.local_replicas * self.strategy.role.num_workers

    @property
    def identity(self) -> dict[str, Any]:
        return run_identity(self.settings, self.dataset.name, self.precision.policy,
                            self.global_batch_size)

    def describe(self) -> dict[str, Any]:
        """The plan as plain data, for the start summary and for metrics.json."""
        return {
            "devices": list(self.strategy.devices),
            "device_type": self.device_type,
            "physical_devices": list(self.device_names),
            "replicas": self.replicas,
            "per_replica_batch_size": self.per_replica_batch_size,
            "global_batch_size": self.global_batch_size,
            "precision_policy": self.precision.policy,
            "precision_reason": self.precision.reason,
            "cross_device_ops": self.strategy.cross_device_ops,
            "cross_device_ops_reason": self.strategy.reason,
            "strategy": self.strategy.kind,
            "xla": self.xla,
            "dataset": self.dataset.name,
            "dataset_source": self.dataset.describe(),
            "train_samples": self.train_size,
            "test_samples": self.test_size,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.settings.epochs,
            "resume_from_epoch": self.resume_epoch,
            "output_dir": str(self.output_dir),
        }


def run_identity(
    settings: Settings, dataset: str, policy: str, global_batch_size: int
) -> dict[str, Any]:
    """What must match for a run folder to be resumed (EPOCHS may grow, devices may not)."""
    return {
        "dataset": dataset,
        "per_replica_batch_size": settings.batch_size,
        "global_batch_size": global_batch_size,
        "learning_rate": settings.learning_rate,
        "seed": settings.seed,
        "precision_policy": policy,
    }


# --------------------------------------------------------------------------------- plan


def _compute_capabilities(launch: Launch) -> list[tuple[int, int] | None]:
    return [gpu.compute_capability.value for gpu in launch.selection.gpus]


def preflight(launch: Launch) -> None:
    """The doctor's checks that decide whether training can start (driver, CUDA, cuDNN,
    visible devices); stops the run with their findings and fixes when one fails.

    A bad setting (a GPU the machine does not have) is a ConfigError (exit 2), anything
    else a RunFailed (exit 1). With GPUS=none or no GPU it costs milliseconds.
    """
    from mgpu_env.doctor import preflight as doctor_preflight

    failing = doctor_preflight(launch.resolved.settings.gpus)
    if not failing:
        return
    lines = []
    for check in failing:
        expected = f" (expected {check.expected})" if check.expected else ""
        lines.append(f"pre-flight check failed: {check.title}: {check.found}{expected}")
        if check.fix:
            lines.append(f"  Fix: {check.fix}")
    lines.append("  `mgpu doctor` shows the whole report.")
    error = ConfigError if any(check.bad_setting for check in failing) else RunFailed
    raise error("\n".join(lines))


def plan_training(launch: Launch, environ: Mapping[str, str] | None = None) -> TrainPlan:
    """Resolve the whole run. Imports TensorFlow (to count devices); writes no file.

    Raises ConfigError for settings that cannot work together on these devices.
    """
    environ = os.environ if environ is None else environ
    settings = launch.resolved.settings
    preflight(launch)
    notes: list[str] = []
    if launch.selection.note:
        notes.append(launch.selection.note)

    import tensorflow as tf

    from mgpu_env.hardware.devices import configure_virtual_devices

    cluster = resolve_cluster(settings)  # TF_CONFIG, or WORKER_HOSTS + WORKER_INDEX
    role = cluster.role if cluster is not None else None
    try:
        if role is None:
            logical = configure_virtual_devices(
                settings.virtual_devices,
                [g.memory_free_mib.value or 0 for g in launch.selection.gpus] or None,
            )
        else:
            logical = _worker_devices(settings.virtual_devices)
    except RuntimeError as err:
        raise RunFailed(f"TensorFlow could not set up the devices: {err}") from None
    device_type = logical.device_type
    if device_type == "CPU" and launch.selection.gpus:
        notes.append(
            f"{len(launch.selection.gpus)} GPU(s) selected but TensorFlow sees none: "
            "training runs on the CPU (run mgpu doctor)"
        )
    strategy_plan = plan_strategy(
        settings.cross_device_ops,
        logical.logical,
        device_type,
        logical.physical,
        nccl_available=nccl_possible(built_with_cuda=tf.test.is_built_with_cuda()),
        role=role,
    )
    precision = choose_precision(
        settings.mixed_precision,
        device_type,
        _compute_capabilities(launch) if device_type == "GPU" else [],
    )
    dataset = resolve_dataset(settings.dataset, settings.data_dir, environ)
    if dataset.note:
        notes.append(dataset.note)
    train_size, test_size = KNOWN_SIZES[dataset.name]
    replicas = strategy_plan.local_replicas * strategy_plan.role.num_workers
    global_batch = settings.batch_size * replicas
    steps = train_size // global_batch
    if steps == 0:
        raise ConfigError(
            f"The global batch ({settings.batch_size} x {replicas} replicas = {global_batch}) "
            f"is larger than the {train_size} training samples of {dataset.name}.\n"
            f"  Fix: set BATCH_SIZE to at most {train_size // replicas}."
        )
    output_dir = settings.output_dir or rundir.default_output_dir(settings.run_name)
    identity = run_identity(settings, dataset.name, precision.policy, global_batch)
    folder = rundir.inspect_run_folder(output_dir, identity)
    resume_epoch = _completed_epochs(folder)
    if resume_epoch > settings.epochs:
        raise ConfigError(
            f"OUTPUT_DIR={output_dir} holds a run already trained for {resume_epoch} epochs, "
            f"more than EPOCHS={settings.epochs}.\n"
            f"  Fix: set EPOCHS to {resume_epoch} or more, or choose another OUTPUT_DIR."
        )
    device_names = (
        tuple(g.name for g in launch.selection.gpus) if device_type == "GPU" else ("CPU",)
    )
    return TrainPlan(
        settings=settings,
        defaulted=tuple(d for d in launch.resolved.defaulted if d in TRAIN_SETTINGS),
        device_type=device_type,
        device_names=device_names,
        strategy=strategy_plan,
        precision=precision,
        dataset=dataset,
        train_size=train_size,
        test_size=test_size,
        per_replica_batch_size=settings.batch_size,
        global_batch_size=global_batch,
        steps_per_epoch=steps,
        xla=settings.xla,
        output_dir=output_dir,
        folder=folder,
        resume_epoch=resume_epoch,
        notes=tuple(notes),
    )


def _worker_devices(virtual_devices: int) -> LogicalDevices:
    """The local devices of a multi-worker run, found without starting TensorFlow's runtime.

    MultiWorkerMirroredStrategy must be created before the runtime starts ("Collective ops
    must be configured at program startup"), and listing logical devices would start it;
    physical devices can be listed, and split, before that.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    device_type = "GPU" if gpus else "CPU"
    physical = gpus or tf.config.list_physical_devices("CPU")[:1]
    split = virtual_devices if virtual_devices >= 2 else 1
    if split > 1:
        for device in physical:
            config = (
                tf.config.LogicalDeviceConfiguration(memory_limit=4096)
                if device_type == "GPU"
                else tf.config.LogicalDeviceConfiguration()
            )
            tf.config.set_logical_device_configuration(device, [config] * split)
    names = tuple(f"/device:{device_type}:{i}" for i in range(len(physical) * split))
    return LogicalDevices(device_type, len(physical), names)


def _completed_epochs(folder: rundir.RunFolder) -> int:
    """Epochs done according to the latest checkpoint's name (ckpt-<epoch>); 0 if none."""
    if folder.fresh:
        return 0
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(folder.checkpoint_dir))
    if latest is None:
        return 0
    try:
        return int(latest.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise ConfigError(
            f"{latest} is not a checkpoint mgpu wrote. Fix: choose another OUTPUT_DIR."
        ) from None


# ----------------------------------------------------------------------------- reporting


class Reporter:
    """What the run tells the user while it trains. The default prints nothing."""

    def note(self, message: str) -> None:
        """A one-line remark (resuming, data loaded, ...)."""

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        """Epoch `epoch` (1-based) of `epochs` starts, with `steps` steps."""

    def steps_done(self, steps: int, loss: float, accuracy: float) -> None:
        """`steps` steps of the current epoch are done; running loss and accuracy."""

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        """The epoch finished; `record` is its history entry."""


class ProgbarReporter(Reporter):
    """Keras' per-epoch progress bar, like `model.fit(verbose=1)`."""

    def __init__(self, echo: Callable[[str], None] = print) -> None:
        self._echo = echo
        self._bar: Any = None

    def note(self, message: str) -> None:
        self._echo(message)

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        import keras

        self._echo(f"Epoch {epoch}/{epochs}")
        self._bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy"])

    def steps_done(self, steps: int, loss: float, accuracy: float) -> None:
        if self._bar is not None:
            self._bar.update(steps, [("loss", loss), ("accuracy", accuracy)])

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        self._bar = None


# ------------------------------------------------------------------------------- signals


@dataclass
class StopRequest:
    """Set by SIGTERM/SIGINT; the loop stops at the next step boundary."""

    signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def _stop_on_signals(stop: StopRequest) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a stop request; a second SIGINT interrupts at once."""

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.signum = signum

    previous = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, handle)
    except ValueError:
        pass  # Not the main thread (e.g. a test runner's worker): no handlers then.
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -------------------------------------------------------------------------------- result


@dataclass
class TrainResult:
    """What a run produced; `metrics` is what metrics.json holds."""

    output_dir: Path
    metrics: dict[str, Any]
    already_finished: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def test_accuracy(self) -> float:
        return float(self.metrics["test_accuracy"])

    @property
    def train_samples_per_sec(self) -> float:
        return float(self.metrics["train_samples_per_sec"])

    @property
    def wall_time_s(self) -> float:
        return float(self.metrics["wall_time_s"])


def resume_command(output_dir: Path) -> str:
    return f"OUTPUT_DIR={output_dir} mgpu train"


# ----------------------------------------------------------------------------------- run


def run_training(plan: TrainPlan, reporter: Reporter | None = None) -> TrainResult:
    """Train as planned; checkpoint every epoch; write the outputs when done.

    Raises ConfigError (bad data, an unreadable checkpoint), RunFailed (TensorFlow failed)
    or Interrupted (a signal stopped the run; the command to resume is in the message).
    """
    reporter = reporter or Reporter()
    started = time.time()
    # A multi-worker run goes on even when finished: the chief's state decides for all.
    if plan.strategy.role.num_workers == 1 and plan.folder.finished_metrics is not None and (
        plan.folder.finished_metrics.get("epochs_completed") == plan.settings.epochs
    ):
        return TrainResult(plan.output_dir, plan.folder.finished_metrics, already_finished=True)
    stop = StopRequest()
    multi_worker = plan.strategy.kind == "multi_worker"
    session = WorkerSession(plan.settings, plan.strategy.role if multi_worker else None)
    with _stop_on_signals(stop):
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


def _train(
    plan: TrainPlan, reporter: Reporter, stop: StopRequest, started: float,
    session: WorkerSession,
) -> TrainResult:
    import keras
    import tensorflow as tf

    # Iterating a distributed dataset inside tf.function reads its options in graph mode;
    # TensorFlow warns about that on every run, and it changes nothing here.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")

    from mgpu_env.training.data import test_dataset, train_base, train_dataset
    from mgpu_env.training.model import build_model, build_optimizer
    from mgpu_env.training.precision import apply_precision
    from mgpu_env.training.steps import make_step_functions
    from mgpu_env.training.strategy import make_strategy

    settings = plan.settings
    is_chief = plan.strategy.role.is_chief
    arrays = load_arrays(plan.dataset, settings.seed)
    _check_sizes(plan, arrays)

    apply_precision(plan.precision)
    keras.utils.set_random_seed(settings.seed)
    session.join()
    strategy = make_strategy(plan.strategy)
    session.after_strategy(strategy, agreement_values(
        settings, dataset=plan.dataset.name, precision_policy=plan.precision.policy,
        local_replicas=plan.strategy.local_replicas, train_samples=arrays.train_size,
        steps_per_epoch=plan.steps_per_epoch,
    ))
    with strategy.scope():
        model = build_model(settings.seed)
        optimizer = build_optimizer(settings.learning_rate, plan.precision.loss_scaling)
        # Build the optimizer's slots now, so a checkpoint restores into all of them.
        optimizer.build(model.trainable_variables)
        epoch_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    steps = make_step_functions(
        strategy, model, optimizer, plan.global_batch_size,
        loss_scaling=plan.precision.loss_scaling, jit_compile=plan.xla,
    )

    if is_chief:
        rundir.claim_run_folder(plan.folder, plan.identity)
        checkpoint_dir = plan.folder.checkpoint_dir
    else:
        # Every worker must take part in saving (the save is collective); only the chief's
        # copy is kept. The others save to a scratch folder, deleted at the end.
        checkpoint_dir = session.checkpoint_dir(plan.folder.checkpoint_dir)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_counter)
    manager = tf.train.CheckpointManager(
        checkpoint, str(checkpoint_dir), max_to_keep=CHECKPOINTS_KEPT,
        checkpoint_name="ckpt",
    )
    start_epoch = _restore(checkpoint, manager, epoch_counter)
    # Multi-worker: the chief's checkpoint is the truth; the others receive its values, so
    # they need no shared folder (and resume from the same epoch).
    session.share_restored(strategy, [*model.variables, *optimizer.variables, epoch_counter])
    start_epoch = int(epoch_counter.numpy())
    history = rundir.read_history(plan.output_dir, start_epoch) if start_epoch else []
    if start_epoch:
        reporter.note(f"Resuming from the checkpoint of epoch {start_epoch} in {checkpoint_dir}")

    writer = tf.summary.create_file_writer(str(plan.output_dir / rundir.LOG_DIR)) if (
        is_chief
    ) else tf.summary.create_noop_writer()
    trained_samples = 0
    trained_seconds = 0.0
    samples_per_epoch = plan.steps_per_epoch * plan.global_batch_size
    base = train_base(arrays)
    for epoch in range(start_epoch, settings.epochs):
        if stop.requested:
            _raise_interrupted(plan, stop, epoch)
        dataset = strategy.experimental_distribute_dataset(
            train_dataset(arrays, plan.global_batch_size, settings.seed, epoch, base)
        )
        iterator = iter(dataset)
        steps.reset_train_metrics()
        reporter.epoch_begin(epoch + 1, settings.epochs, plan.steps_per_epoch)
        epoch_start = time.perf_counter()
        done = 0
        while done < plan.steps_per_epoch:
            count = min(STEPS_PER_CALL, plan.steps_per_epoch - done)
            steps.train_steps(iterator, tf.constant(count, dtype=tf.int32))
            session.progress()
            done += count
            loss = float(steps.train_loss.result())
            accuracy = float(steps.train_accuracy.result())
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
        if is_chief:
            # history.json first, the checkpoint second: on resume, history is cut back to
            # the checkpoint's epoch, so a kill between the two loses nothing.
            rundir.write_history(plan.output_dir, history)
        epoch_counter.assign(epoch + 1)
        session.progress("saving the checkpoint")
        manager.save(checkpoint_number=epoch + 1)
        session.progress("training")
        with writer.as_default(step=epoch + 1):
            for name in ("loss", "accuracy", "samples_per_sec"):
                _write_scalar(name, record[name])
        writer.flush()
        reporter.epoch_end(record)
    if stop.requested and plan.settings.epochs > start_epoch:
        # The signal came during the last epoch's save: everything is saved, so finish.
        reporter.note("Stop requested after the last epoch was saved; finishing the run")

    steps.test_loss.reset_state()
    steps.test_accuracy.reset_state()
    session.progress("evaluating")
    steps.evaluate(strategy.experimental_distribute_dataset(
        test_dataset(arrays, plan.global_batch_size)
    ))
    test_accuracy = float(steps.test_accuracy.result())
    test_loss = float(steps.test_loss.result())
    with writer.as_default(step=settings.epochs):
        _write_scalar("test_accuracy", test_accuracy)
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
            plan.output_dir / rundir.MODEL_FILE, lambda path: model.save(path), ".keras"
        )
        rundir.atomic_write_json(plan.output_dir / rundir.METRICS_FILE, metrics)
    return TrainResult(plan.output_dir, metrics)


def _write_scalar(name: str, value: float) -> None:
    """A TensorBoard scalar, written with TensorFlow alone.

    `tf.summary.scalar` lives in the tensorboard package, which TensorFlow 2.21 no longer
    installs; `tf.summary.write` with the scalars plugin's metadata writes the same event.
    """
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(data_class=summary_pb2.DATA_CLASS_SCALAR)
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(name, tf.constant(value, tf.float32),
                     metadata=metadata.SerializeToString())


def _samples_per_sec(samples: int, seconds: float, history: list[dict[str, Any]]) -> float:
    """This process's training throughput; when it trained no epoch (it resumed a run killed
    after its last checkpoint), the mean of the epochs the history recorded."""
    if seconds > 0:
        return samples / seconds
    rates = [float(e["samples_per_sec"]) for e in history if "samples_per_sec" in e]
    return sum(rates) / len(rates) if rates else 0.0


def _check_sizes(plan: TrainPlan, arrays: Arrays) -> None:
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


def _raise_interrupted(plan: TrainPlan, stop: StopRequest, epoch: int) -> None:
    signum = stop.signum or signal.SIGTERM
    name = signal.Signals(signum).name
    kept = (
        f"the checkpoint of epoch {epoch} is kept" if epoch else "no epoch had completed yet"
    )
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
    arrays: Arrays,
) -> dict[str, Any]:
    described = plan.describe()
    return {
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
