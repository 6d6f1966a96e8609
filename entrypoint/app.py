"""The typer application: `mgpu train`, `mgpu doctor`, `mgpu bench`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from entrypoint import bench, doctor, train
from entrypoint.options import EXIT_FAILED, debug_enabled
from mgpu_env.config.errors import MgpuError

app = typer.Typer(
    name="mgpu",
    help="Multi-GPU TensorFlow training with MirroredStrategy, and the checks around it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("train")(train.command)
app.command("doctor")(doctor.command)
app.command("bench")(bench.command)


@app.callback()
def root(
    debug: Annotated[
        bool,
        typer.Option("--debug", envvar="MGPU_DEBUG", help="Show tracebacks for errors."),
    ] = False,
) -> None:
    """Settings come from flags, the environment, a .env file, then defaults."""


def main() -> None:
    """Run the CLI; errors meant for the user print one message, not a traceback."""
    try:
        app()
    except MgpuError as err:
        if debug_enabled():
            raise
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except Exception as err:
        if debug_enabled():
            raise
        typer.echo(
            f"error: {type(err).__name__}: {err}\n  (run with --debug for the traceback)",
            err=True,
        )
        sys.exit(EXIT_FAILED)
