"""`mgpu train`'s plan: what a run will do, resolved from the runtime before anything trains.

`plan_training(runtime)` adds to the runtime's decisions (devices, precision, all-reduce,
cluster) what only training needs: the run (`identity.identify`: the folder, the data set,
the batches), the keep limit, whether it resumes and whether it is finished already. It is
pure: no TensorFlow, no network, no user code imported, no data read, no file written
(tests/unit/test_pure_plan.py runs it with all four refused). A built-in data set's sizes are
known before it is read (official: `sizes`); a loader's or a folder's only by loading it.

`DataPlan` is what the sizes decide, once they are known (`plan_data`): the feed and the
steps per epoch. `prepare.prepare` decides it from the loaded data; a dry run of a built-in
set from its official sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import Settings, with_role
from mgpu_env.hardware.devices import DeviceSplit
from mgpu_env.hardware.folders import folder_access
from mgpu_env.runtime import Runtime
from mgpu_env.runtime.precision import PrecisionChoice
from mgpu_env.runtime.strategy import StrategyPlan
from mgpu_env.training.input import keep
from mgpu_env.training.input.data import Data, DatasetChoice, DataSizes
from mgpu_env.training.input.feeds import FeedPlan, plan_feed
from mgpu_env.training.run import rundir
from mgpu_env.training.run.finished import FinishedRun, finished_in
from mgpu_env.training.run.identity import RunIdentity, identify
from mgpu_env.training.run.resume import resume_note
from mgpu_env.training.run.state import check_run_state
from mgpu_env.training.shared.messages import plural, unwritable_folder
from mgpu_env.training.shared.position import Position

# The layout of `mgpu train --dry-run --json`; raised when a key is removed or changes meaning.
SCHEMA_VERSION = 1
# The settings `mgpu train` reads (the others belong to other commands, or to the
# cluster), for the "settings" lines of the summary and the settings in metrics.json.
TRAIN_SETTINGS = with_role("shown")
# What settings.json records: every setting a training run reads, the cluster's included.
RUN_SETTINGS = with_role("recorded")
# Known sizes, so the plan need not read (or download) the data; `prepare` checks a file's.
# Digits: 1797 samples, 20% held out by a stratified split.
KNOWN_SIZES = {
    "mnist": DataSizes(60_000, 10_000),
    "fashion_mnist": DataSizes(60_000, 10_000),
    "synthetic": DataSizes(60_000, 10_000),
    "digits": DataSizes(1437, 360),
}


@dataclass(frozen=True)
class DataPlan:
    """What the data's sizes decide (`plan_data`, once per run): the feed and the steps of an
    epoch, with the sizes and shape the model and the summary read."""

    sizes: DataSizes
    feed: FeedPlan

    @property
    def train_size(self) -> int:
        return self.sizes.train_size

    @property
    def test_size(self) -> int:
        return self.sizes.test_size

    @property
    def steps_per_epoch(self) -> int:
        return self.feed.steps_per_epoch

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape, as the model sees it."""
        return self.sizes.sample_shape

    @property
    def num_classes(self) -> int:
        return self.sizes.num_classes


_START = Position(0)  # a fresh run's resume


@dataclass(frozen=True)
class TrainPlan:
    """Everything a run will do that is known before its data is read: the runtime's
    decisions plus the run's own."""

    runtime: Runtime
    start: RunIdentity  # the folder, the data set, the global batch, run.json's identity
    folder: rundir.RunFolder
    # metrics.json of this run when its folder holds it finished with EPOCHS epochs
    # (`finished.finished_in`): nothing to train; a cluster's workers still meet, and keep it.
    finished: FinishedRun | None
    # A built-in data set's official sizes, known before it is read; None for a loader's or
    # a folder's, known only by loading it (`prepare`).
    sizes: DataSizes | None
    notes: tuple[str, ...] = ()
    keep: keep.KeepLimit = keep.FALLBACK  # the most training data kept on each device
    # Where output_dir's latest checkpoint stands (the start for a fresh run).
    resume: Position = _START

    @property
    def dataset(self) -> DatasetChoice:
        return self.start.dataset

    @property
    def global_batch_size(self) -> int:
        return self.start.global_batch_size

    @property
    def output_dir(self) -> Path:
        return self.start.output_dir

    @property
    def identity(self) -> dict[str, Any]:
        return self.start.values

    @property
    def model(self) -> str:
        """MODEL: `mlp` or the user's `package.module:function`."""
        return self.settings.model

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def strategy_plan(self) -> StrategyPlan:
        return self.runtime.strategy_plan

    @property
    def precision(self) -> PrecisionChoice:
        return self.runtime.precision

    @property
    def split(self) -> DeviceSplit:
        return self.runtime.split

    @property
    def device_type(self) -> str:
        return self.runtime.device_type

    @property
    def device_names(self) -> tuple[str, ...]:
        """GPU names, or "CPU": one per physical device."""
        if self.device_type == "GPU":
            return tuple(gpu.name for gpu in self.runtime.selection.gpus)
        return ("CPU",)

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run folder (the other workers write scratch)."""
        return self.strategy_plan.role.is_chief

    @property
    def resume_command(self) -> str:
        """What a user runs to resume this run, for every message that stops it."""
        return f"OUTPUT_DIR={self.output_dir} mgpu train"

    @property
    def per_replica_batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def xla(self) -> bool:
        return self.settings.xla

    @property
    def replicas(self) -> int:
        """All replicas: local ones times the number of workers."""
        return self.runtime.replicas

    def settings_provenance(self, names: Iterable[str] = TRAIN_SETTINGS) -> dict[str, Any]:
        """The run's settings with where each came from ({"EPOCHS": {"value": "1",
        "source": "env"}}), for the start summary, --dry-run --json and settings.json."""
        return self.runtime.resolved.provenance(names)

    def to_dict(self, data: DataPlan) -> dict[str, Any]:
        """The whole plan as JSON-ready data: what `--dry-run --json` prints."""
        return {
            "schema_version": SCHEMA_VERSION,
            "mgpu_version": __version__,
            **self.describe(data),
            "notes": list(self.notes),
            "warnings": list(self.runtime.resolved.warnings),
            "settings": self.settings_provenance(),
        }

    @property
    def chosen(self) -> dict[str, str]:
        """What the run resolved for the settings that ask for a choice (`auto`, `1`), keyed
        by the setting: the workers agree on these, not on the requests."""
        return {"DATASET": self.dataset.name, "MIXED_PRECISION": self.precision.policy,
                "KERAS": self.runtime.keras.version}

    def describe(self, data: DataPlan) -> dict[str, Any]:
        """The plan and its data's as plain data, for the start summary and metrics.json."""
        return {
            "devices": list(self.strategy_plan.devices),
            "device_type": self.device_type,
            "physical_devices": list(self.device_names),
            "replicas": self.replicas,
            "per_replica_batch_size": self.per_replica_batch_size,
            "global_batch_size": self.global_batch_size,
            "precision_policy": self.precision.policy,
            "precision_reason": self.precision.reason,
            "cross_device_ops": self.strategy_plan.cross_device_ops,
            "cross_device_ops_reason": self.strategy_plan.reason,
            "strategy": self.strategy_plan.kind,
            "cluster": self.runtime.cluster_description(),
            "xla": self.xla,
            "dataset": self.dataset.name,
            "dataset_source": self.dataset.describe(),
            "model": self.model,
            "input_shape": list(data.input_shape),
            "num_classes": data.num_classes,
            "train_samples": data.train_size,
            "test_samples": data.test_size,
            "steps_per_epoch": data.steps_per_epoch,
            "feed": data.feed.describe(),
            "epochs": self.settings.epochs,
            "resume_from_epoch": self.resume.epoch,
            "resume_from_step": self.resume.step,
            "checkpoint_every": str(self.settings.checkpoint_every),
            "output_dir": str(self.output_dir),
        }


def output_dir_of(runtime: Runtime) -> Path:
    """The run folder, as decided when the command started (`rundir.decide_output_dir`)."""
    return rundir.run_folder(runtime.settings)


def check_output_dir(runtime: Runtime) -> None:
    """Refuse a run folder this user cannot write (ConfigError, exit 2): the folder itself
    (run.json, settings.json, history.json, model.keras and metrics.json are renamed into
    it), its checkpoints/ and its logs/ (TensorBoard's), each as it is or, not there yet,
    where it will be created. `train` and `dry_run` call it before anything slow (the
    pre-flight, a loader, TensorFlow): it would otherwise fail at the first checkpoint, or
    at the first epoch's summary."""
    if not runtime.strategy_plan.role.is_chief:
        return
    folder = output_dir_of(runtime)
    for path in (folder, folder / rundir.CHECKPOINT_DIR, folder / rundir.LOG_DIR):
        access = folder_access(path)
        if access.problem() is not None:
            raise ConfigError(unwritable_folder(access))


def plan_training(
    runtime: Runtime, environ: Mapping[str, str] | None = None, *,
    looked_up: Iterable[str] = (),
) -> TrainPlan:
    """Resolve the whole run on an applied runtime: pure (no TensorFlow, no network, no
    user code, no data read, no file written).

    First the run (`identity.identify`) and whether its folder holds it finished already
    (then, for one process, nothing will be written: the folder's access is not checked);
    then a folder this user cannot write is refused, before anything slow. `looked_up`:
    notes of what the caller found on the network (a dry run's peers that do not
    resolve), placed among the start's notes. Raises ConfigError for settings that cannot
    work together on these devices, or a folder that holds another run.
    """
    settings = runtime.settings
    start = identify(runtime, environ)
    finished = finished_in(start, settings.epochs)
    if finished is None or runtime.strategy_plan.role.num_workers != 1:
        check_output_dir(runtime)
    notes = _start_notes(runtime, looked_up)
    if start.dataset.note:
        notes.append(start.dataset.note)
    keep_limit = plan_keep(runtime, runtime.strategy_plan.role.num_workers)
    notes.append(keep_limit.note())
    # Every file of the folder checked, and against the others, before any is believed.
    state = (check_run_state(start.output_dir)
             if start.output_dir.is_dir() and runtime.strategy_plan.role.is_chief else None)
    folder = rundir.inspect_run_folder(start.output_dir, start.values)
    # The other workers resume where the chief's checkpoint says (it shares its values).
    position = state.position if state is not None and not folder.fresh else Position(0)
    if position > Position(settings.epochs):
        raise ConfigError(beyond_epochs(start.output_dir, position, settings.epochs))
    return TrainPlan(
        runtime=runtime, start=start, folder=folder,
        finished=finished,
        # A loader's or a folder's sizes are known only by calling or counting it: `prepare`.
        sizes=None if start.dataset.origin in ("hook", "files") else KNOWN_SIZES[
            start.dataset.name],
        notes=tuple(notes), keep=keep_limit, resume=position,
    )


def beyond_epochs(output_dir: Path, position: Position, epochs: int) -> str:
    """A start whose EPOCHS is below what its folder holds, refused as a finished run is
    answered: what the folder holds, and the two ways on."""
    at = (plural(position.epoch, "epoch") if not position.step else
          f"{position.describe()} ({plural(position.epoch, 'epoch')} and "
          f"{plural(position.step, 'step')})")
    return (
        f"OUTPUT_DIR={output_dir} holds this run trained to {at}, beyond EPOCHS={epochs}: "
        "a run of fewer epochs cannot be made of it.\n"
        f"  Fix: to train it on, EPOCHS={position.epoch + 1} or more with the same "
        "OUTPUT_DIR; to train a run of fewer epochs, another RUN_NAME or OUTPUT_DIR."
    )


def plan_data(plan: TrainPlan, data: Data | DataSizes) -> DataPlan:
    """The run's feed for this data (`feeds.plan_feed`), decided once per run, from the
    loaded data (`prepare`) or a built-in set's official sizes (a dry run). Refuses a global
    batch larger than the training samples."""
    runtime, global_batch = plan.runtime, plan.global_batch_size
    feed = plan_feed(data, plan.keep, global_batch, runtime.strategy_plan.role.num_workers)
    if feed.steps_per_epoch == 0:
        batch, replicas, rows = runtime.settings.batch_size, runtime.replicas, data.train_size
        raise ConfigError(
            f"The global batch ({batch} x {replicas} replicas = {global_batch}) "
            f"is larger than the {rows} training samples of {plan.dataset.name}.\n"
            f"  Fix: set BATCH_SIZE to at most {rows // replicas}."
        )
    sizes = data if isinstance(data, DataSizes) else DataSizes.of(data)
    return DataPlan(sizes, feed)


def _start_notes(runtime: Runtime, looked_up: Iterable[str]) -> list[str]:
    """The summary's notes on the start: the runtime's, the settings a resumed run took from
    its folder, what the caller looked up (a dry run's peers), and the strategy's."""
    notes = list(runtime.notes)
    if (resumed := resume_note(runtime.resolved)) is not None:
        notes.insert(0, resumed)
    notes.extend(looked_up)
    if runtime.strategy_plan.note:
        notes.append(runtime.strategy_plan.note)
    return notes


def plan_keep(runtime: Runtime, workers: int) -> keep.KeepLimit:
    """The run's keep limit, from the selected GPUs' free memory (a split GPU: each logical
    device's memory limit) or, on the CPU, the host's available memory."""
    split, gpus = runtime.split, runtime.selection.gpus
    if split.memory_limit_mib:
        free: list[int | None] = list(split.memory_limit_mib)
    else:
        free = [gpu.memory_free_mib.value for gpu in gpus]
    host = None if gpus else keep.host_available_bytes()
    cpu_replicas = 0 if gpus else runtime.strategy_plan.local_replicas
    return keep.keep_limit(free, host, cpu_replicas=cpu_replicas, workers=workers)
