"""The typer application: `mgpu train`, `mgpu run`, `mgpu doctor`, `mgpu bench`."""

from __future__ import annotations

from typing import Annotated

import typer

from entrypoint import bench, doctor, launch, train
from entrypoint.options import DEBUG
from mgpu_env.about import about
from mgpu_env.tfprobes import tfimport

app = typer.Typer(
    name="mgpu",
    help="Multi-GPU TensorFlow training with MirroredStrategy, and the checks around it.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Click's plain help: rich's panels cut option names to fit 80 columns
    # (`--data-determinist…`) and pad lines with spaces; plain help wraps whole words.
    rich_markup_mode=None,
)
app.command("train")(train.command)
app.command("doctor")(doctor.command)
app.command("bench")(bench.command)
app.command("run", context_settings=launch.CONTEXT_SETTINGS)(launch.command)


def show_version(value: bool) -> None:
    if value:
        typer.echo(about().line())
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", envvar="MGPU_DEBUG",
            help="Show tracebacks for errors, and TensorFlow's start-up log.",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=show_version, is_eager=True,
            help="Print mgpu's, TensorFlow's and Python's versions (and the image's tag).",
        ),
    ] = False,
) -> None:
    """Settings come from flags, the environment, a .env file, then defaults."""
    DEBUG.enabled = debug
    tfimport.STARTUP_LOG.show = debug


def main() -> None:
    """Run the CLI (errors become exit codes in `entrypoint.options.exit_codes`)."""
    app()
