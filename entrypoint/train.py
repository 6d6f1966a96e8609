"""`mgpu train`: run the packaged MirroredStrategy training."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from entrypoint.options import (
    TAG,
    GpusPerWorkerOption,
    SettingFlags,
    WorkersOption,
    fail,
    launch_workers,
    resolve,
    say,
    supervise_train,
    with_settings,
)
from mgpu_env import training
from mgpu_env.api import start_process
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG
from mgpu_env.training.run.resume import resolve_run_settings
from mgpu_env.training.shared.messages import plural

if TYPE_CHECKING:  # the training modules come after runtime.apply() set the environment
    from mgpu_env.runtime import Runtime
    from mgpu_env.training.run.loop import TrainResult
    from mgpu_env.training.run.memcheck import MemoryCheck
    from mgpu_env.training.run.plan import DataPlan, TrainPlan
    from mgpu_env.training.run.prepare import PreparedRun
    from mgpu_env.training.run.progress import Progress


def plan_lines(plan: TrainPlan, data: DataPlan, memory: MemoryCheck,
               verbose: bool = False) -> list[str]:
    """The one-screen start summary (also what --dry-run prints): the settings that were
    set, and how many kept their defaults (all of them with `verbose`); `memory`: the
    memory check's lines (the estimate per replica, each GPU's share)."""
    info = plan.describe(data)
    devices = ", ".join(info["devices"])
    physical = ", ".join(info["physical_devices"])
    role = plan.strategy_plan.role
    if not role.is_chief:
        # Only the chief's folder holds checkpoints; it sends this worker where to resume.
        resume = "fresh or resumed, as the chief's checkpoint says"
        output = f"nothing here: {role.task_type} {role.task_id} writes to a temporary folder"
    else:
        resume = (
            f"resumes at step {plan.resume.step} of epoch {plan.resume.epoch + 1} of "
            f"{plan.settings.epochs}" if plan.resume.step
            else f"resumes after epoch {plan.resume.epoch} of {plan.settings.epochs}"
            if plan.resume.epoch
            else "fresh run"
        )
        output = str(plan.output_dir)
    if plan.settings.gpus.kind == "none":
        # Said, so that the CPU on a GPU machine is never a surprise (the doctor's gate stops
        # GPUS=all there when no GPU is usable; GPUS=none is the way to ask for the CPU).
        physical += "; GPUS=none: the CPU on purpose, every GPU hidden"
    lines = [
        f"  devices        {plan.strategy_plan.local_replicas} x {plan.device_type} ({physical})",
        f"                 {devices}",
        f"  replicas       {plan.replicas} ({plan.strategy_plan.kind})",
        *([f"  cluster        {line}"] if (line := plan.runtime.cluster_line()) else []),
        f"  batch          {plan.per_replica_batch_size} per replica, "
        f"{plan.global_batch_size} global, {plural(data.steps_per_epoch, 'step')} per epoch",
        f"  precision      {plan.precision.policy} ({plan.precision.reason})",
        f"  all-reduce     {plan.strategy_plan.cross_device_ops} ({plan.strategy_plan.reason})",
        f"  xla            {'on (forward and backward pass)' if plan.xla else 'off'}",
        f"  dataset        {plan.dataset.describe()}: {data.train_size} train, "
        f"{data.test_size} test",
        f"  feed           {data.feed.kind} ({data.feed.why})",
        f"  model          {_model_line(plan.model, data)}",
        *(f"  {'memory' if i == 0 else '':<15}{line.removeprefix('memory ')}"
          for i, line in enumerate(memory.lines)),
        f"  epochs         {plan.settings.epochs}, {resume}",
        f"  checkpoints    {plan.settings.checkpoint_every.describe()}, "
        "with the data's position (the size and seconds of one: told as training starts)",
        f"  output         {output}",
    ]
    lines.extend(settings_lines(plan.settings_provenance(), verbose=verbose))
    lines.extend(f"  note: {note}" for note in plan.notes)
    return lines


def settings_lines(
    provenance: dict[str, dict[str, str]], width: int = 100, verbose: bool = False
) -> list[str]:
    """`EPOCHS=1 (env), BATCH_SIZE=128 (.env), 14 defaults (--verbose lists them)`, wrapped
    under a `settings` heading; with `verbose` the defaults are listed too, after the set."""
    items = sorted(provenance.items(), key=lambda item: item[1]["source"] == "default")
    defaults = sum(1 for _, entry in items if entry["source"] == "default")
    if not verbose:
        items = [item for item in items if item[1]["source"] != "default"]
    words = [
        f"{name}={entry['value'] if entry['value'] else '(empty)'} ({entry['source']})"
        for name, entry in items
    ]
    if not verbose and defaults:
        words.append(f"{defaults} default{'s' if defaults > 1 else ''} (--verbose lists them)")
    lines, current = [], ""
    for word in words:
        if current and 17 + len(current) + len(", ") + len(word) + len(",") > width:
            lines.append(current + ",")
            current = word
        else:
            current = f"{current}, {word}" if current else word
    if current:
        lines.append(current)
    return [f"  {'settings' if i == 0 else '':<15}{line}" for i, line in enumerate(lines)]


def interactive(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """A terminal that takes colour: Keras' redrawn, coloured progress bar is for it only.
    Anything else (a pipe, a log file, NO_COLOR) gets one plain line per epoch."""
    return stream.isatty() and not environ.get("NO_COLOR")


def _model_line(model: str, data: DataPlan) -> str:
    shape = f"input {data.input_shape}, {data.num_classes} classes"
    if model == "mlp":
        return f"mlp (the tutorial's MLP), {shape}"
    return f"{model} (your builder), {shape}"


def _progress(quiet: bool, plan: TrainPlan) -> Progress:
    """How progress is shown: nothing (QUIET), a progress bar on a terminal, else a line an
    epoch (logs and CI)."""
    from mgpu_env.training.run.progress import EpochLines, Progbar, Progress

    if quiet:
        return Progress()
    if interactive(sys.stdout, os.environ):
        return Progbar(say, samples_per_step=plan.global_batch_size)
    return EpochLines(say)


def dry_run_json(plan: TrainPlan, data: DataPlan, memory: MemoryCheck) -> str:
    """`--dry-run --json`: the plan, the memory estimate, and the runtime's decisions in the
    shape `mgpu doctor --json` and `mgpu bench --dry-run --json` state them."""
    return json.dumps({**plan.to_dict(data), "memory": memory.as_dict(),
                       "decisions": plan.runtime.decided()}, indent=2)


@with_settings(scope="train")
def command(
    flags: SettingFlags,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the resolved plan and exit.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --dry-run: print the plan as one JSON object.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v",
                           help="List every setting in the start summary, defaults too.")
    ] = False,
    resume_from: Annotated[
        str | None, typer.Option(
            "--resume-from", metavar="CKPT",
            help="Resume the run folder from its checkpoint CKPT (ckpt-2, ckpt-2-30), "
                 "setting aside what contradicts it: the way out a damaged folder's "
                 "error names.")
    ] = None,
    workers: WorkersOption = None,
    gpus_per_worker: GpusPerWorkerOption = None,
) -> None:
    """Train the tutorial's MLP on every selected GPU (MirroredStrategy)."""
    # Long: the command's paths (workers, a supervised child, a dry run, the run) in order.
    started = time.time()  # the wall time includes the start-up: TensorFlow, data, model
    if as_json and not dry_run:
        fail("error: --json goes with --dry-run (a run's results are in metrics.json).",
             EXIT_BAD_CONFIG)
    if workers is not None:
        if as_json:
            fail("error: --json prints one plan; with --workers each worker would print "
                 "its own. Fix: leave out --workers or --json.", EXIT_BAD_CONFIG)
        argv = ["train", *(["--dry-run"] if dry_run else []), *(["-v"] if verbose else []),
                *(["--resume-from", resume_from] if resume_from else [])]
        raise typer.Exit(code=launch_workers(flags, workers, gpus_per_worker, argv, "train"))
    resolved = resolve(flags, resolve_run_settings)  # a resumed run: its folder's settings
    if (supervised := supervise_train(flags, resolved, dry_run, verbose, resume_from)) is not None:
        raise typer.Exit(code=supervised)  # --max-restarts: the run was a supervised child
    runtime = start_process(resolved, "train")  # a GPU the machine lacks: exit 2
    TAG.set_for(runtime)
    if dry_run:
        if resume_from:
            fail("error: --resume-from changes the run folder; a dry run writes nothing. "
                 "Fix: leave out --dry-run or --resume-from.", EXIT_BAD_CONFIG)
        plan, data, memory = training.dry_run(runtime, preflight=_preflight)
        if as_json:
            typer.echo(dry_run_json(plan, data, memory))
            return
        say("mgpu train: dry run, nothing is trained or written")
        for line in plan_lines(plan, data, memory, verbose):
            say(line)
        return

    def show(prepared: PreparedRun) -> Progress:
        say("mgpu train")
        for line in plan_lines(prepared.plan, prepared.data_plan, prepared.memory, verbose):
            say(line)
        return _progress(resolved.settings.quiet, prepared.plan)

    result = training.train(runtime, preflight=_preflight, show=show, started=started,
                            resume_from=resume_from)
    _say_result(result, runtime.strategy_plan.role.is_chief)


def _preflight(runtime: Runtime, wait_for_peers: bool) -> None:
    """The doctor's pre-flight (looked up when called: tests replace it)."""
    from mgpu_env import doctor

    doctor.require_ready(runtime, wait_for_peers=wait_for_peers)


def _say_result(result: TrainResult, is_chief: bool) -> None:
    """The last lines of a run: what it reached and where its outputs are, or that the run
    folder already held the finished run."""
    if result.finished is not None:
        say(result.finished.message())
        return
    say(
        f"Done: test accuracy {result.test_accuracy:.4f}, "
        f"{result.train_samples_per_sec:,.0f} samples/s, training time "
        f"{result.training_time_s:.1f} s (the epochs), wall time {result.wall_time_s:.1f} s "
        "(start-up included)"
    )
    if "memory" in result.metrics:  # beside the estimate, each GPU's first peak (or none)
        from mgpu_env.training.run.memcheck import memory_result_line

        line = memory_result_line(result.metrics["memory"])
        if line is not None:
            say(f"  {line}")
    if is_chief:
        say(
            f"  outputs in {result.output_dir} (metrics.json, model.keras, checkpoints/, logs/)"
        )
