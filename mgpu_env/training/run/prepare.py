"""`mgpu train`'s second phase: from the pure plan to a run ready to train.

`prepare(plan)` does what the plan only names: it starts TensorFlow the decided way (the
device split, the precision policy: `Execution.prepare_tensorflow`, once), loads the data
once, checks a built-in file against its official sizes, and records the real sizes, the
steps per epoch and the feed (`feedplan.plan_feed`) in the plan it returns with the data.
The loop (`loop.run_training`) trains a `PreparedRun`.

`--dry-run` shows the plan without training: `dry_run_plan` loads only what the plan cannot
know (a loader's or a folder's data, as `prepare` does) and builds a user's model on the CPU
against the data's shape; a built-in set's dry run stays pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data import Data, DataSizes, load_data
from mgpu_env.training.run.plan import TrainPlan, feed_of


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its plan, with the loaded data's sizes and feed, and the data."""

    plan: TrainPlan
    data: Data


def prepare(plan: TrainPlan) -> PreparedRun:
    """Start TensorFlow's devices and precision (once), load the data (once) and record its
    sizes and feed. Raises ConfigError for data that does not match the plan (a built-in
    file of other sizes) or a global batch larger than the training samples."""
    prepare_tensorflow = _once(plan.runtime.execution.prepare_tensorflow)
    prepare_tensorflow()
    return _load(plan, prepare_tensorflow)


def dry_run_plan(plan: TrainPlan) -> TrainPlan:
    """The plan `--dry-run` shows: a loader's or a folder's data loaded for its sizes (a
    loader may start TensorFlow; a folder's counts are cached after the first time), and a
    user's MODEL built on the CPU against the data's shape, so a model that does not fit
    the data fails here (its note added)."""
    if plan.sizes is None:
        plan = _load(plan, _once(plan.runtime.execution.prepare_tensorflow)).plan
    if plan.model == "mlp":
        return plan
    # The builder is called only in the strategy's scope when training starts; the dry
    # run builds it on the CPU.
    from mgpu_env.training.step import user_code

    note = user_code.check_on_cpu(plan.model, plan.input_shape, plan.num_classes)
    return dataclasses.replace(plan, notes=(*plan.notes, note))


def _load(plan: TrainPlan, prepare_tensorflow: Callable[[], None]) -> PreparedRun:
    """Load the data once and record its sizes and feed in the plan."""
    workers = plan.strategy.role.num_workers
    if plan.dataset.origin == "hook":
        prepare_tensorflow()  # a loader may use TensorFlow: its devices and policy first
    # Files not counted yet are counted with TensorFlow after the same preparation, or
    # (multi-worker: TensorFlow must not start before the strategy) in a child process.
    data = load_data(plan.dataset, plan.settings.seed, in_process=workers == 1,
                     prepare=prepare_tensorflow)
    sizes = DataSizes.of(data)
    if plan.sizes is not None and (sizes.train_size, sizes.test_size) != (
        plan.sizes.train_size, plan.sizes.test_size
    ):
        # The plan (and the run's identity, and the dry run) use the official sizes; a file
        # of another size is some other data set under a known name, so it is refused.
        raise ConfigError(
            f"{plan.dataset.describe()} has {sizes.train_size} training and "
            f"{sizes.test_size} test samples; {plan.dataset.name} has {plan.train_size} and "
            f"{plan.test_size}.\n  Fix: replace the file with the official one."
        )
    feed = feed_of(plan.runtime, plan.dataset, data, plan.global_batch_size, plan.keep)
    return PreparedRun(dataclasses.replace(plan, sizes=sizes, feed=feed), data)


def _once(step: Callable[[], None]) -> Callable[[], None]:
    """`step`, run on the first call only (`prepare_tensorflow` is once per process)."""
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            step()

    return run
