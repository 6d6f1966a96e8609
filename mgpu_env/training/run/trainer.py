"""The trainer: `mgpu train`'s whole sequence, in the order it runs, in this one module.

`train(runtime)` owns the sequence from the applied runtime to the finished run (its plan,
then `run_plan`), `dry_run(runtime)` the sequence to the plan it shows, as Keras' `fit()`
and orbit's `Controller.train()` own theirs; the command only resolves the settings, calls
one of them and renders what it returns.

    finished  pure: a folder that holds this run finished answers "nothing to do"
    hold      the chief holds the run folder (`hold`: one run per folder) until it ends;
              a second start is refused here, before the folder's state is read
    plan      pure: the run, the folder's state checked (`state`), the resume position
    memory    each replica's memory, estimated in a child (`memcheck`): a batch that
              cannot fit is refused before TensorFlow starts here
    preflight the doctor's checks (passed in: training and the doctor never import each
              other), which in a cluster wait for the peers' names to resolve
    --------- `run_plan`, under the run's signal handling and its stall watch:
    prepare   TensorFlow, the data, the feed's plan (`prepare`); shown (`show`)
    start     strategy, model, optimizer, steps and their compiled loops (`step.build`)
    restore   the run folder claimed, the latest checkpoint restored: where to start
    feed      the data adapter the plan names (`input.feeds`): where its rows are, from
              that position; the trainer's loops run the steps over them
    epochs    each epoch: its steps in calls, a checkpoint when one is due inside it, a
              stop at a call's end; then its record, checkpoint and summaries (`epochs`)
    finish    the evaluation on the test set, the model and metrics.json (`loop.finish`)

The stages' details are in `loop` (and the epochs' actions in `epochs`); their order is
here. TensorFlow may be imported from here on only: the runtime has been applied
(CUDA_VISIBLE_DEVICES and TF_CONFIG are set).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mgpu_env.runtime import Runtime
from mgpu_env.runtime.cluster import peers
from mgpu_env.training.run.finished import finished_run
from mgpu_env.training.run.hold import FolderHold, hold_run_folder
from mgpu_env.training.run.identity import identify
from mgpu_env.training.run.loop import (
    Outputs,
    Start,
    TrainResult,
    epoch_loop,
    failures_said,
    finish,
    open_feed,
    profile_steps,
    record_start,
    restore_checkpoints,
    start_trainer,
    worker_session,
)
from mgpu_env.training.run.memcheck import MemoryCheck, check_memory
from mgpu_env.training.run.plan import (
    DataPlan,
    TrainPlan,
    check_output_dir,
    output_dir_of,
    plan_training,
)
from mgpu_env.training.run.prepare import PreparedRun, prepare
from mgpu_env.training.run.progress import Progress
from mgpu_env.training.run.repair import resume_from_checkpoint
from mgpu_env.training.run.signals import StopRequest, stop_on_signals

# The doctor's pre-flight (`mgpu_env.doctor.require_ready`): the runtime, and whether to
# wait for a cluster's peers (a dry run only notes the missing ones).
Preflight = Callable[[Runtime, bool], None]


def train(
    runtime: Runtime, *, preflight: Preflight,
    show: Callable[[PreparedRun], Progress] | None = None, started: float | None = None,
    resume_from: str | None = None,
) -> TrainResult:
    """Train the run the applied runtime describes, or answer that its folder holds it
    finished (`TrainResult.finished`, said before TensorFlow is imported).

    `show`: called once the run is prepared (its data's sizes and feed known) and before
    it trains; it returns what shows the progress (the command prints the start summary
    there). `started` (`time.time()`): the wall time's start (default: now).
    `resume_from`: a checkpoint's name (`ckpt-2-30`): the way out of a damaged run folder
    (`repair.resume_from_checkpoint`), done once the folder is held. Raises ConfigError
    (exit 2), RunFailed (exit 1) or Interrupted (128 + the signal).
    """
    started = time.time() if started is None else started
    if resume_from is None and (finished := finished_run(runtime)) is not None:
        return TrainResult.nothing_to_do(finished)
    with hold_for(runtime) as hold:
        notes = list(hold.notes)
        if resume_from is not None and runtime.strategy_plan.role.is_chief:
            notes += resume_from_checkpoint(output_dir_of(runtime), resume_from,
                                            identify(runtime).values)
        plan = plan_training(runtime, looked_up=notes)  # pure: no TensorFlow, no data read
        # A cluster goes on even when finished: the chief's state decides for every worker.
        if plan.finished is not None and plan.strategy_plan.role.num_workers == 1:
            return TrainResult.nothing_to_do(plan.finished)
        # Before the pre-flight, which imports TensorFlow where there are GPUs. A loader's or a
        # folder's data gives its shape only once loaded: `prepare` checks it after the load.
        memory = None if plan.sizes is None else check_memory(plan, plan.sizes, dry_run=False)
        preflight(runtime, True)
        return run_plan(plan, show, started, memory)


def run_plan(
    plan: TrainPlan, show: Callable[[PreparedRun], Progress] | None = None,
    started: float | None = None, memory: MemoryCheck | None = None,
) -> TrainResult:
    """Prepare the plan (once, under the run's signal handling), show it (`show` returns
    what shows the progress; default: nothing), train it, checkpoint every epoch, write
    the outputs when done. `started` (`time.time()`): when the command started, the start
    of the wall time (default: now). `memory`: the memory check the sequence made before
    TensorFlow started (None: `prepare` makes it once the data's shape is known).

    Raises ConfigError (bad data, an unreadable checkpoint), RunFailed (TensorFlow failed)
    or Interrupted (a signal stopped the run; the command to resume is in the message).
    """
    started = time.time() if started is None else started
    stop, session = StopRequest(), worker_session(plan)  # the stall watch starts here
    with stop_on_signals(stop), failures_said(plan, session):
        prepared = prepare(plan, memory)
        progress = show(prepared) if show is not None else Progress()
        start = Start(started, progress, stop, session)
        trainer = start_trainer(prepared, session)
        saved, position = restore_checkpoints(plan, trainer, session, prepared.data_record)
        record_start(prepared, start, saved, position)
        feed = open_feed(prepared, trainer, position)
        if plan.settings.profile:
            profile_steps(prepared, trainer, progress)
        outputs = Outputs.of(plan, trainer, saved)
        epochs = epoch_loop(prepared, start, outputs, feed, position)
        for begin in epochs.remaining():
            # Its steps in calls; after each call its actions (checks, progress, a checkpoint
            # when one is due inside the epoch, a stop); after it, its record, checkpoint and
            # summaries (`epochs.after_call_actions`, `after_epoch_actions`).
            epochs.train_epoch(begin)
        if stop.requested and plan.settings.epochs > epochs.start_epoch:
            # The signal came during the last epoch's save: everything is saved, so finish.
            progress.note("Stop requested after the last epoch was saved; finishing the run")
        return finish(prepared, epochs, outputs, start)


def hold_for(runtime: Runtime) -> FolderHold:
    """The run folder held for this start: by the chief (or its launcher, `hold`); the
    other workers of a cluster write no run folder and hold nothing. Every folder the run
    writes is checked writable first."""
    check_output_dir(runtime)
    folder = output_dir_of(runtime)
    if not runtime.strategy_plan.role.is_chief:
        return FolderHold(folder, None)
    return hold_run_folder(folder)


def dry_run(runtime: Runtime, *, preflight: Preflight
            ) -> tuple[TrainPlan, DataPlan, MemoryCheck]:
    """The plan `mgpu train --dry-run` shows, what its data's sizes decide and the memory
    check: nothing is trained or written. The network is asked once (a cluster's peers
    that do not resolve yet are noted, not waited for); a loader's or a folder's data is
    loaded for its sizes, and the model (a user's MODEL too) built on the CPU in a child
    for the memory estimate (`prepare.dry_run_data`)."""
    from mgpu_env.training.run.prepare import dry_run_data

    plan = plan_training(runtime, looked_up=unresolved_peers(runtime))
    preflight(runtime, False)
    return dry_run_data(plan)


def unresolved_peers(runtime: Runtime) -> list[str]:
    """A note on a cluster's peers whose names do not resolve yet (DNS, once, no wait): a
    real run's pre-flight waits up to WORKER_TIMEOUT for them instead."""
    if runtime.cluster is None:
        return []
    missing = peers.wait_until_resolved(runtime.cluster, 0)
    if not missing:
        return []
    return [f"peers that do not resolve yet: {', '.join(missing)} (a real run "
            "waits up to WORKER_TIMEOUT for them)"]
