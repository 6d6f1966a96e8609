"""Turning the library's setting declarations into typer options, and failing cleanly.

Each setting is declared once, in `mgpu_env.config.settings.Settings`; `with_settings` adds one
`--flag` per declaration to a command, so `mgpu train --help` lists every setting with its
env var and default, and a new setting needs no change here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import sys
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer

from mgpu_env.config.errors import MgpuError
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_FAILED
from mgpu_env.config.resolve import ResolvedSettings, resolve_settings, strict_errors
from mgpu_env.config.settings import DECLARATIONS, Declaration, SettingsErrors
from mgpu_env.runtime import Runtime, build_runtime
from mgpu_env.runtime.cluster import local
from mgpu_env.runtime.keras import Command

SettingFlags = dict[str, str | None]


def _hide_flag_types() -> None:
    """typer 0.29's help prints a type after every option, flags too (`--help <bool>`,
    `--xla/--no-xla <bool>`), although a flag takes no value: show none for flags."""
    option = typer.core.TyperOption
    shown = option.display_type_rich

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    setattr(option, "display_type_rich", display_type_rich)  # noqa: B010

    # An argument with its own metavar (`SCRIPT [ARGS]...`) says what it takes already;
    # typer would add the Python type after it (`<list[str]>`).
    argument = typer.core.TyperArgument
    argument_shown = argument.display_type_rich

    def argument_type(self: Any, ctx: Any) -> str | None:
        return None if self.metavar else argument_shown(self, ctx)

    setattr(argument, "display_type_rich", argument_type)  # noqa: B010


_hide_flag_types()


SETTINGS_PANEL = "Settings (flag > environment > .env > default)"


def _option_help(declaration: Declaration, command: str) -> str:
    default = declaration.default or "empty"
    if declaration.kind == "switch":
        default = "on" if declaration.parse(declaration.default) else "off"
    return f"{declaration.help_on(command)} (env {declaration.env}, default {default})"


def _setting_option(declaration: Declaration, command: str) -> inspect.Parameter:
    """One setting's typer option: `--name VALUE`, or for a switch `--name/--no-name`
    (plus its short flag), which passes no value and so cannot swallow the next flag."""
    if declaration.kind == "switch":
        names = [f"{declaration.flag}/{declaration.off_flag}"]
        names += [declaration.short] if declaration.short else []
        annotation: Any = Annotated[
            bool | None,
            typer.Option(
                *names, help=_option_help(declaration, command), show_default=False,
                rich_help_panel=SETTINGS_PANEL,
            ),
        ]
    else:
        names = [declaration.flag] + ([declaration.short] if declaration.short else [])
        annotation = Annotated[
            str | None,
            typer.Option(
                *names, help=_option_help(declaration, command), metavar=declaration.metavar,
                show_default=False, rich_help_panel=SETTINGS_PANEL,
            ),
        ]
    return inspect.Parameter(
        declaration.field_name, inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=annotation,
    )


def _as_text(value: str | bool | None) -> str | None:
    # A switch's flag arrives as a bool; the library parses every setting from its text.
    if isinstance(value, bool):
        return "1" if value else "0"
    return value


STRICT_HELP = (
    "An unknown or misspelled setting (EPOCH=3 in .env or the environment) is an error, "
    f"exit {EXIT_BAD_CONFIG}, instead of a warning. (env MGPU_STRICT)"
)


def _strict_option() -> inspect.Parameter:
    return inspect.Parameter(
        "strict", inspect.Parameter.KEYWORD_ONLY, default=False,
        annotation=Annotated[bool, typer.Option("--strict", envvar="MGPU_STRICT",
                                                help=STRICT_HELP, show_envvar=False)],
    )


def with_settings(
    only: Iterable[str] | None = None, scope: str = "train"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one option per setting; it receives them as `flags` (env name -> text).

    `only` limits the flags to those settings; else the command (`scope`: "train", "run",
    "bench") gets the common settings and those declared for it, and `--strict`
    (MGPU_STRICT), which `resolve` reads. The options carry no envvar of their own:
    precedence (flag > environment > env file > default) and validation belong to
    `mgpu_env.config.resolve.resolve_settings`.
    """
    wanted = set(only) if only is not None else None

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        # A command offers only the flags it uses: `only` names them, else the scopes do.
        declarations = [
            d
            for d in DECLARATIONS
            if (d.env in wanted if wanted is not None else d.scope in (("common",), (scope,))
                or scope in d.scope)
        ]
        # Resolve string annotations (from __future__ import annotations) to the real
        # Annotated[...] objects, or typer would not see the commands' own typer.Option()s.
        hints = typing.get_type_hints(command, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(command).parameters.values()
            if p.name != "flags"
        ]
        setting_params = [_setting_option(d, scope) for d in declarations]
        by_field = {d.field_name: d.env for d in declarations}

        takes_strict = wanted is None

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            flags: SettingFlags = {
                by_field[k]: _as_text(kwargs.pop(k)) for k in list(kwargs) if k in by_field
            }
            STRICT.enabled = bool(kwargs.pop("strict", False)) if takes_strict else False
            with exit_codes():
                return command(flags=flags, **kwargs)

        parameters = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own
        ] + ([_strict_option()] if takes_strict else []) + setting_params
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        del wrapper.__wrapped__  # typer must see the new signature, not the command's
        return wrapper

    return decorate


@dataclass
class LineTag:
    """What starts every line mgpu prints in a multi-worker run ("[worker 1] "): a batch
    system writes every worker's output into files read side by side, or into one."""

    text: str = ""

    def set_for(self, runtime: Runtime) -> None:
        cluster = runtime.cluster
        self.text = "" if cluster is None else cluster.line_tag


TAG = LineTag()


def say(message: str, err: bool = False) -> None:
    """Print mgpu's own lines (to stderr with `err`), each with the worker's tag."""
    if TAG.text:
        message = "\n".join(TAG.text + line for line in message.split("\n"))
    typer.echo(message, err=err)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print a user-facing error to stderr and exit with `code`."""
    say(message, err=True)
    raise typer.Exit(code=code)


@contextlib.contextmanager
def exit_codes() -> Iterator[None]:
    """The one place errors become exit codes: the library's MgpuErrors their own (2 bad
    settings or input, 1 a failed run, 128 + N a signal), anything else 1; one message on
    stderr, the traceback only with --debug. Every command runs inside it (`with_settings`),
    whether from `mgpu` or typer's test runner.
    """
    try:
        yield
    except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
        raise  # typer's own way out, with its own code
    except BrokenPipeError:
        # The reader went away (`mgpu train | head`): nothing more can be shown, and
        # Python must not complain about it again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        raise typer.Exit(code=EXIT_FAILED) from None
    except MgpuError as err:
        if DEBUG.enabled:
            raise
        fail(err.user_message(), err.exit_code)
    except Exception as err:
        if DEBUG.enabled:
            raise
        fail(
            f"error: {type(err).__name__}: {err}\n  (run with --debug for the traceback)",
            EXIT_FAILED,
        )


Resolver = Callable[[SettingFlags, Mapping[str, str]], ResolvedSettings]


def resolve(flags: SettingFlags, resolver: Resolver = resolve_settings) -> ResolvedSettings:
    """The settings: flag > environment > settings file > default. Raises SettingsErrors.

    Names that look like a mistyped setting are warned about on stderr, or with `--strict`
    (MGPU_STRICT=1) refused with exit 2, with every unknown name of the settings file.
    `mgpu train` passes its own `resolver`, which lets a resumed run's folder stand in for
    the defaults.
    """
    resolved = resolver(flags, os.environ)
    if STRICT.enabled and (errors := strict_errors(resolved)):
        raise SettingsErrors(errors)
    for warning in resolved.warnings:
        say(f"warning: {warning}", err=True)
    return resolved


@dataclass
class StrictFlag:
    """`--strict` / MGPU_STRICT of the running command, as `with_settings` parsed it."""

    enabled: bool = False


STRICT = StrictFlag()


@dataclass
class DebugFlag:
    """`mgpu --debug` / MGPU_DEBUG, as the root callback parsed it."""

    enabled: bool = False


DEBUG = DebugFlag()


# --workers / --gpus-per-worker: declared once, for `mgpu train` and `mgpu run`.
WORKERS_PANEL = "Several workers on this machine"
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers", metavar="N", show_default=False, rich_help_panel=WORKERS_PANEL,
        help="Start N workers here, on free loopback ports (MultiWorkerMirroredStrategy), "
        "each line prefixed [worker i]; signals reach all, one failing stops all.",
    ),
]
GpusPerWorkerOption = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-worker", metavar="K", show_default=False, rich_help_panel=WORKERS_PANEL,
        help="With --workers: K of the selected GPUs per worker, in order (default: the "
        "GPUs split evenly; as many workers as GPUs is one process per GPU).",
    ),
]


def restarts_need_workers(flags: SettingFlags, workers: int | None) -> None:
    """--max-restarts restarts the workers --workers starts: alone, it would do nothing.
    (MAX_RESTARTS in the environment or a settings file is left alone: the workers
    themselves inherit it.)"""
    if workers is None and flags.get("MAX_RESTARTS") is not None:
        fail(f"error: --max-restarts {flags['MAX_RESTARTS']} restarts the workers that "
             "--workers N starts; without --workers there are none.\n  Fix: add --workers "
             "N, or leave --max-restarts out (under Slurm or Kubernetes the engine restarts "
             "jobs: srun --requeue, a Job's backoffLimit).", EXIT_BAD_CONFIG)


def launch_workers(
    flags: SettingFlags, workers: int, gpus_per_worker: int | None, argv: list[str],
    command: Command,
) -> int:
    """`--workers N`: the settings checked here once (bad ones exit 2 before any worker
    starts), then `mgpu ARGV` once per worker with the flags passed as environment
    variables (a flag beats the environment, and so does a worker's variable), each
    worker's address, GPUs and the shared run name; returns the launcher's exit code."""
    resolved = resolve(flags)
    runtime = build_runtime(resolved, command=command)  # the GPU selection, the cluster
    settings = resolved.settings
    plan = local.plan_local_workers(workers, gpus_per_worker, local.LaunchingHere(
        [gpu.index for gpu in runtime.selection.gpus],
        has_run_folder=bool(settings.output_dir or settings.run_name),
        cluster_engine=runtime.cluster.engine if runtime.cluster is not None else None,
    ))
    if not settings.quiet:
        for line in plan.describe(settings.max_restarts):
            say(f"mgpu {command} --workers {workers}: {line}" if not line.startswith(" ")
                else line, err=True)
    environ = {**os.environ, **{env: text for env, text in flags.items() if text is not None}}
    environ.update({"MGPU_DEBUG": "1"} if DEBUG.enabled else {})
    environ.update({"MGPU_STRICT": "1"} if STRICT.enabled else {})
    with _held_by_launcher(command, argv, settings, plan, environ):
        return local.supervise(plan, [sys.executable, "-m", "entrypoint", *argv], environ,
                               how=local.Supervision(max_restarts=settings.max_restarts))


def supervise_train(flags: SettingFlags, resolved: ResolvedSettings, dry_run: bool,
                    verbose: bool, resume_from: str | None) -> int | None:
    """`mgpu train --max-restarts K` in one process: the run as a supervised child
    (`recovery.supervise_run`), its exit code; None where this process trains itself (a
    dry run, no restarts asked, or a worker of a cluster, whose launcher or engine restarts
    it)."""
    settings = resolved.settings
    if dry_run or not settings.max_restarts:
        return None
    if resume_from:
        # Each restart would set the folder back to CKPT again, losing what it trained.
        fail(f"error: --resume-from {resume_from} goes back once; with --max-restarts "
             "every restart would go back to it again.\n  Fix: run --resume-from once "
             "without --max-restarts, then resume with --max-restarts.", EXIT_BAD_CONFIG)
    argv = ["train", *(["-v"] if verbose else [])]
    runtime = build_runtime(resolved, command="train")  # the GPUs, the all-reduce, once
    if runtime.cluster is not None:
        return None
    from mgpu_env.recovery import Recovering, RunDevices, supervise_run

    gpus = tuple(gpu.index for gpu in runtime.selection.gpus)
    devices = RunDevices(gpus, max(1, runtime.replicas // len(gpus)) if gpus else 1,
                         settings.batch_size * runtime.replicas)
    folder = settings.output_dir
    assert folder is not None  # decided by `resolve_run_settings`
    recovering = Recovering(
        folder, devices, runtime.strategy_plan.cross_device_ops, settings.cross_device_ops,
        settings.min_gpus, say=lambda line: say(f"mgpu: {line}", err=True),
        max_restarts=settings.max_restarts)
    if not settings.quiet:
        say(f"mgpu train --max-restarts {settings.max_restarts}: the run is supervised, "
            f"restarted from its last checkpoint if it dies or stalls (MIN_GPUS="
            f"{settings.min_gpus})", err=True)
    environ = {**os.environ, **{env: text for env, text in flags.items() if text is not None}}
    environ.update({"MGPU_DEBUG": "1"} if DEBUG.enabled else {})
    environ.update({"MGPU_STRICT": "1"} if STRICT.enabled else {})
    from mgpu_env.training.run.hold import HELD_BY_ENV, hold_run_folder

    with hold_run_folder(folder):
        environ[HELD_BY_ENV] = str(os.getpid())
        return supervise_run([sys.executable, "-m", "entrypoint", *argv], environ, recovering)


@contextlib.contextmanager
def _held_by_launcher(command: Command, argv: list[str], settings: Any,
                      plan: local.LocalWorkers, environ: dict[str, str]) -> Iterator[None]:
    """`mgpu train --workers N` holds the run folder for the whole run, restarts included
    (`training.run.hold`), and names itself to its workers; a dry run writes nothing."""
    if command != "train" or "--dry-run" in argv:
        yield
        return
    from mgpu_env.runtime.runfolder import run_folder
    from mgpu_env.training.run.hold import HELD_BY_ENV, hold_run_folder

    # The workers' folder: the name the launcher gave them when RUN_NAME is empty.
    named = settings if settings.run_name or not plan.run_name else \
        dataclasses.replace(settings, run_name=plan.run_name)
    folder = run_folder(named)
    with hold_run_folder(folder):
        environ[HELD_BY_ENV] = str(os.getpid())
        yield
