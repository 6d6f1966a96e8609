"""`mgpu run`: the command that runs your own training script with the settings applied.

`mgpu run SCRIPT [ARGS]...` / `mgpu run -m MODULE [ARGS]...`: your training script with the
settings applied (GPUS, VIRTUAL_DEVICES, MIXED_PRECISION, the cluster)."""

from __future__ import annotations

from typing import Annotated

import typer

from entrypoint.options import (
    TAG,
    GpusPerWorkerOption,
    SettingFlags,
    WorkersOption,
    launch_workers,
    resolve,
    restarts_need_workers,
    say,
    with_settings,
)
from mgpu_env import launcher
from mgpu_env.api import start_process
from mgpu_env.training.run.resume import resolve_script_settings

# The settings flags go before SCRIPT; everything from SCRIPT on is the script's, unparsed
# (`--epochs 3` after SCRIPT is the script's argument, as with `python SCRIPT`).
CONTEXT_SETTINGS = {
    "allow_interspersed_args": False,
    "ignore_unknown_options": True,
    "allow_extra_args": True,
}


@with_settings(scope="run")
def command(
    flags: SettingFlags,
    target: Annotated[
        list[str] | None,
        typer.Argument(metavar="SCRIPT [ARGS]...", show_default=False,
                       help="The script and its arguments (with -m: the module)."),
    ] = None,
    module: Annotated[
        bool, typer.Option("-m", help="Run a module as `python -m` does: SCRIPT is "
                                      "package.module.")
    ] = False,
    workers: WorkersOption = None,
    gpus_per_worker: GpusPerWorkerOption = None,
) -> None:
    """Run your own training script with the settings applied, as `python SCRIPT` would.

    Its exit code is mgpu's; an exception shows the script's traceback and exits 1.
    Inside it, `mgpu_env.strategy()` is the strategy the settings describe, and a plain
    `tf.distribute.MirroredStrategy()` takes the selected devices; each strategy the script
    builds is said on stderr, with the fix when its replicas are not the plan's.
    """
    if target and target[0].startswith("-"):
        # Unknown options pass through to the script, so one before it lands here.
        raise typer.BadParameter(
            f"{target[0]} is not an option of mgpu run (`mgpu run --help` lists them); the "
            "script's own options go after it: mgpu run SCRIPT --epochs 3",
            param_hint="SCRIPT",
        )
    restarts_need_workers(flags, workers)  # --max-restarts: with --workers only
    if workers is not None:
        launcher.resolve_target(target or [], module=module)  # no such script: exit 2 here
        argv = ["run", *(["-m"] if module else []), *(target or [])]
        raise typer.Exit(code=launch_workers(flags, workers, gpus_per_worker, argv, "run"))
    resolved = resolve(flags, resolve_script_settings)  # bad settings: exit 2, before the script
    run_target = launcher.resolve_target(target or [], module=module)
    scan = launcher.scan_target(run_target)  # Keras 2 era code: KERAS=auto gives it tf_keras
    runtime = start_process(resolved, "run",  # a GPU the machine lacks: exit 2
                            keras_2_code=scan.keras_2_evidence())
    TAG.set_for(runtime)
    with launcher.stall_watch(runtime):  # STALL_TIMEOUT: TensorFlow's start to the script's end
        launcher.prepare(runtime)
        if not resolved.settings.quiet:
            for line in launcher.summary(runtime, run_target, scan):
                say(line, err=True)
        code = launcher.run_target(run_target, runtime, scan)
    raise typer.Exit(code=code)
