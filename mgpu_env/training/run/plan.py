"""`mgpu train`'s plan: what a run will do, resolved from the runtime before anything trains.

`plan_training(runtime)` adds to the runtime's decisions (devices, precision, all-reduce,
cluster) what only training needs: the data set, the batches, the feed, the run folder and
whether it resumes (the doctor's pre-flight has passed before: the command runs it). It is
pure: no TensorFlow, no data read, no file written. A built-in data set's sizes are known
(official); a loader's or a folder's are unknown (`sizes` None) until `prepare.prepare`
loads the data and records them. `--dry-run` prints the plan and stops.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import DECLARATIONS, Settings, with_role
from mgpu_env.hardware.devices import DeviceSplit
from mgpu_env.hardware.folders import folder_access
from mgpu_env.runtime import Runtime
from mgpu_env.runtime.cluster import peers
from mgpu_env.runtime.precision import PrecisionChoice
from mgpu_env.runtime.strategy import StrategyPlan
from mgpu_env.training.input import keep
from mgpu_env.training.input.data import Data, DatasetChoice, DataSizes, resolve_dataset
from mgpu_env.training.input.feedplan import FeedPlan, plan_feed
from mgpu_env.training.run import rundir
from mgpu_env.training.run.messages import unwritable_folder
from mgpu_env.training.run.resume import resume_note

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
class TrainPlan:
    """Everything a run will do: the runtime's decisions plus the run's own."""

    runtime: Runtime
    dataset: DatasetChoice
    global_batch_size: int
    output_dir: Path
    folder: rundir.RunFolder
    resume_epoch: int  # epochs already completed in output_dir (0 for a fresh run)
    # The data's sizes and the feed decided from them: a built-in set's from the start; None
    # for a loader's or a folder's until `prepare` has loaded it (never guessed).
    sizes: DataSizes | None
    feed: FeedPlan | None
    notes: tuple[str, ...] = ()
    keep: keep.KeepLimit = keep.FALLBACK  # the most training data kept on each device

    @property
    def known(self) -> DataSizes:
        """The data's sizes; only a prepared run's plan (or a built-in set's) knows them."""
        if self.sizes is None:
            raise RuntimeError(f"{self.dataset.name}'s sizes are known once it is loaded: "
                               "use the plan `prepare` returns")
        return self.sizes

    @property
    def feed_plan(self) -> FeedPlan:
        """The feed, decided with the sizes (`feedplan.plan_feed`)."""
        if self.feed is None:
            raise RuntimeError(f"{self.dataset.name}'s feed is decided once it is loaded: "
                               "use the plan `prepare` returns")
        return self.feed

    @property
    def train_size(self) -> int:
        return self.known.train_size

    @property
    def test_size(self) -> int:
        return self.known.test_size

    @property
    def steps_per_epoch(self) -> int:
        return self.feed_plan.steps_per_epoch

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape, as the model sees it."""
        return self.known.sample_shape

    @property
    def num_classes(self) -> int:
        return self.known.num_classes

    @property
    def model(self) -> str:
        """MODEL: `mlp` or the user's `package.module:function`."""
        return self.settings.model

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def strategy(self) -> StrategyPlan:
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
        return self.strategy.role.is_chief

    @property
    def finished_before(self) -> dict[str, Any] | None:
        """metrics.json of this run when its folder holds it finished with EPOCHS epochs:
        nothing to train (one process returns it at once; a cluster's workers still meet,
        and keep it)."""
        metrics = self.folder.finished_metrics
        return metrics if rundir.finished_as_asked(metrics, self.settings.epochs) else None

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

    def to_dict(self) -> dict[str, Any]:
        """The whole plan as JSON-ready data: what `--dry-run --json` prints."""
        return {
            "schema_version": SCHEMA_VERSION,
            "mgpu_version": __version__,
            **self.describe(),
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
            "cluster": self.runtime.cluster_description(),
            "xla": self.xla,
            "dataset": self.dataset.name,
            "dataset_source": self.dataset.describe(),
            "model": self.model,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "train_samples": self.train_size,
            "test_samples": self.test_size,
            "steps_per_epoch": self.steps_per_epoch,
            "feed": self.feed_plan.describe(),
            "epochs": self.settings.epochs,
            "resume_from_epoch": self.resume_epoch,
            "output_dir": str(self.output_dir),
        }


def run_identity(
    settings: Settings, dataset: str, policy: str, global_batch_size: int
) -> dict[str, Any]:
    """What must match for a run folder to be resumed (EPOCHS may grow, devices may not):
    the settings declared with the role "identity", with what the run chose for `auto`
    (the data set, the precision policy), and the global batch."""
    chosen: dict[str, Any] = {"DATASET": dataset, "MIXED_PRECISION": policy}
    identity: dict[str, Any] = {"global_batch_size": global_batch_size}
    for declaration in DECLARATIONS:
        if "identity" not in declaration.roles:
            continue
        value = getattr(settings, declaration.field_name)
        if declaration.identity_if_set and value == declaration.parse(declaration.default):
            continue
        identity[declaration.identity] = chosen.get(declaration.env, value)
    return identity


def is_chief(runtime: Runtime) -> bool:
    """Only the chief writes the run folder; the other workers write to scratch folders."""
    return runtime.strategy_plan.role.is_chief


def output_dir_of(runtime: Runtime) -> Path:
    """The run folder, as decided when the command started (`rundir.decide_output_dir`)."""
    return rundir.run_folder(runtime.settings)


def check_output_dir(runtime: Runtime) -> None:
    """Refuse a run folder this user cannot write (ConfigError, exit 2). The command calls
    it before anything slow (the pre-flight, a loader, TensorFlow): it would otherwise
    fail at the first checkpoint."""
    if not is_chief(runtime):
        return
    access = folder_access(output_dir_of(runtime))
    if access.problem() is not None:
        raise ConfigError(unwritable_folder(access))


def plan_training(
    runtime: Runtime, environ: Mapping[str, str] | None = None, *, dry_run: bool = False
) -> TrainPlan:
    """Resolve the whole run on an applied runtime: pure (no TensorFlow, no data read, no
    file written; a user's MODEL module is imported, to fail now if it cannot be).

    The command runs the doctor's pre-flight (`mgpu_env.doctor.require_ready`) first.
    Raises ConfigError for settings that cannot work together on these devices.
    `dry_run`: the peers of a cluster are looked up once and noted, not waited for.
    """
    environ = os.environ if environ is None else environ
    settings = runtime.settings
    output_dir = output_dir_of(runtime)
    check_output_dir(runtime)
    notes = _start_notes(runtime, dry_run)
    dataset = resolve_dataset(settings.dataset, settings.data_dir, environ)
    if dataset.note:
        notes.append(dataset.note)
    if settings.model != "mlp":
        # A builder that cannot be imported fails now, in the plan (and the dry run), not
        # after the data has loaded; it is called later, in the strategy's scope.
        from mgpu_env.training.step import user_code

        user_code.import_hook(settings.model, "MODEL", user_code.MODEL_CONTRACT)
    keep_limit = plan_keep(runtime, runtime.strategy_plan.role.num_workers)
    notes.append(keep_limit.note())
    global_batch = settings.batch_size * runtime.replicas
    # A loader's or a folder's sizes are known only by calling or counting it: `prepare`.
    sizes = None if dataset.origin in ("hook", "files") else KNOWN_SIZES[dataset.name]
    feed = None if sizes is None else feed_of(runtime, dataset, sizes, global_batch, keep_limit)
    identity = run_identity(settings, dataset.name, runtime.precision.policy, global_batch)
    folder = rundir.inspect_run_folder(output_dir, identity)
    resume_epoch = rundir.completed_epochs(folder)
    if resume_epoch > settings.epochs:
        raise ConfigError(
            f"OUTPUT_DIR={output_dir} holds a run already trained for {resume_epoch} epochs, "
            f"more than EPOCHS={settings.epochs}.\n"
            f"  Fix: set EPOCHS to {resume_epoch} or more, or choose another OUTPUT_DIR."
        )
    return TrainPlan(
        runtime=runtime, dataset=dataset, global_batch_size=global_batch,
        output_dir=output_dir, folder=folder, resume_epoch=resume_epoch,
        sizes=sizes, feed=feed, notes=tuple(notes), keep=keep_limit,
    )


def feed_of(
    runtime: Runtime, dataset: DatasetChoice, data: Data | DataSizes, global_batch: int,
    keep_limit: keep.KeepLimit,
) -> FeedPlan:
    """The run's feed for this data (`feedplan.plan_feed`). Refuses a global batch larger
    than the training samples."""
    feed = plan_feed(data, keep_limit, global_batch, runtime.strategy_plan.role.num_workers)
    if feed.steps_per_epoch == 0:
        batch, replicas, rows = runtime.settings.batch_size, runtime.replicas, data.train_size
        raise ConfigError(
            f"The global batch ({batch} x {replicas} replicas = {global_batch}) "
            f"is larger than the {rows} training samples of {dataset.name}.\n"
            f"  Fix: set BATCH_SIZE to at most {rows // replicas}."
        )
    return feed


def _start_notes(runtime: Runtime, dry_run: bool) -> list[str]:
    """The summary's notes on the start: the runtime's, the settings a resumed run took from
    its folder, peers a dry run could not resolve, and the strategy's."""
    notes = list(runtime.notes)
    if (resumed := resume_note(runtime.resolved)) is not None:
        notes.insert(0, resumed)
    if dry_run and runtime.cluster is not None:
        missing = peers.wait_until_resolved(runtime.cluster.workers, runtime.cluster.address, 0)
        if missing:
            notes.append(f"peers that do not resolve yet: {', '.join(missing)} (a real run "
                         "waits up to WORKER_TIMEOUT for them)")
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
