"""`mgpu train`'s second phase: from the pure plan to a run ready to train.

`prepare(plan)` does what the plan only names, for every kind of data alike: it imports a
user's MODEL module (to fail before the data loads, not after), starts TensorFlow the
decided way (the device split, the precision policy: `Execution.prepare_tensorflow`,
once), loads the data once, checks a built-in file against its official sizes, and
decides the feed from the loaded data (`plan.plan_data`, once). The memory check
(`memcheck`) the sequence made before TensorFlow started is passed in; a loader's or a
folder's data, whose shape only the load tells, is checked here, right after it. The loop
(`trainer.run_plan`) trains the `PreparedRun` it returns.

`--dry-run` shows the plan without training: `dry_run_data` loads only what the plan
cannot know (a loader's or a folder's data, as `prepare` does; a built-in set's official
sizes stand for its data) and makes the memory check, whose child builds the model (a
user's too, with its checks) on the CPU against the data's shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data import Data, DataSizes, load_data
from mgpu_env.training.run.dataid import check_same_data, data_identity
from mgpu_env.training.run.memcheck import MemoryCheck, check_memory
from mgpu_env.training.run.plan import DataPlan, TrainPlan, plan_data


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its plan, the loaded data, what the data's sizes decided (the
    feed, the steps per epoch) and the memory check."""

    plan: TrainPlan
    data_plan: DataPlan
    data: Data
    memory: MemoryCheck
    data_record: dict[str, Any]  # the data's identity (`dataid`), run.json's record of it


def prepare(plan: TrainPlan, memory: MemoryCheck | None = None) -> PreparedRun:
    """Import a user's MODEL module, start TensorFlow's devices and precision (once), load
    the data (once) and decide its feed. `memory`: the check made before TensorFlow
    started (None: the data's shape was unknown then, so it is made after the load). Raises
    ConfigError for a builder that cannot be imported, data that does not match the plan
    (a built-in file of other sizes), a global batch larger than the training samples, or
    a batch that cannot fit."""
    _import_model(plan)
    prepare_tensorflow = _once(plan.runtime.execution.prepare_tensorflow)
    prepare_tensorflow()
    data = _load(plan, prepare_tensorflow)
    record = data_identity(data)
    if plan.is_chief:  # the run's record of its data: a resume on other data is refused
        check_same_data(plan.folder.data, record, plan.output_dir, plan.dataset.name)
    data_plan = plan_data(plan, data)
    if memory is None:
        memory = check_memory(plan, data_plan.sizes, dry_run=False)
    return PreparedRun(plan, data_plan, data, memory, record)


def dry_run_data(plan: TrainPlan) -> tuple[TrainPlan, DataPlan, MemoryCheck]:
    """What `--dry-run` shows beside the plan: a built-in set's feed from its official
    sizes, a loader's or a folder's from its loaded data (a loader may start TensorFlow; a
    folder's counts are cached after the first time), and the memory check, whose child
    builds the model on the CPU against the data's shape, so a user's model that does not
    fit the data fails here (its note added to the plan's)."""
    _import_model(plan)
    if plan.sizes is not None:
        data_plan = plan_data(plan, plan.sizes)
    else:
        data_plan = plan_data(plan, _load(plan, _once(plan.runtime.execution.prepare_tensorflow)))
    memory = check_memory(plan, data_plan.sizes, dry_run=True)
    return dataclasses.replace(plan, notes=(*plan.notes, *memory.notes)), data_plan, memory


def _import_model(plan: TrainPlan) -> None:
    """A builder that cannot be imported fails now, before the data loads; it is called
    later, in the strategy's scope. User code: never in the plan."""
    if plan.model != "mlp":
        from mgpu_env.training.step import user_code

        user_code.import_hook(plan.model, "MODEL", user_code.MODEL_CONTRACT)


def _load(plan: TrainPlan, prepare_tensorflow: Callable[[], None]) -> Data:
    """Load the data once; a built-in file must have the official sizes the plan used."""
    workers = plan.strategy_plan.role.num_workers
    if plan.dataset.origin == "hook":
        prepare_tensorflow()  # a loader may use TensorFlow: its devices and policy first
    # Files not counted yet are counted with TensorFlow after the same preparation, or
    # (multi-worker: TensorFlow must not start before the strategy) in a child process.
    data = load_data(plan.dataset, plan.settings.seed, in_process=workers == 1,
                     prepare=prepare_tensorflow)
    sizes, known = DataSizes.of(data), plan.sizes
    if known is not None and (sizes.train_size, sizes.test_size) != (
        known.train_size, known.test_size
    ):
        # The plan (and the run's identity, and the dry run) use the official sizes; a file
        # of another size is some other data set under a known name, so it is refused.
        raise ConfigError(
            f"{plan.dataset.describe()} has {sizes.train_size} training and "
            f"{sizes.test_size} test samples; {plan.dataset.name} has {known.train_size} and "
            f"{known.test_size}.\n  Fix: replace the file with the official one."
        )
    return data


def _once(step: Callable[[], None]) -> Callable[[], None]:
    """`step`, run on the first call only (`prepare_tensorflow` is once per process)."""
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            step()

    return run
