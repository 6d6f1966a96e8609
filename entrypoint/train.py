"""`mgpu train`: run the packaged MirroredStrategy training."""

from __future__ import annotations

from typing import Annotated

import typer

from entrypoint.options import EXIT_BAD_CONFIG, SettingFlags, fail, resolve_or_exit, with_settings
from mgpu_env.launch import choose_gpus
from mgpu_env.settings import SettingsErrors


@with_settings()
def command(
    flags: SettingFlags,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the resolved plan and exit.")
    ] = False,
) -> None:
    """Train the seed's MNIST model on every selected GPU with MirroredStrategy."""
    resolved = resolve_or_exit(flags)
    try:
        launch = choose_gpus(resolved)
    except SettingsErrors as err:
        fail("\n".join(f"error: {e}" for e in err.errors), EXIT_BAD_CONFIG)
    if dry_run:
        typer.echo(f"GPUs: {launch.selection}")
        return
    fail("training is being built", 1)
