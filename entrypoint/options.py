"""Turning the library's setting declarations into typer options, and failing cleanly.

Each setting is declared once, in `mgpu_env.config.settings.Settings`; `with_settings` adds one
`--flag` per declaration to a command, so `mgpu train --help` lists every setting with its
env var and default, and a new setting needs no change here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer

from mgpu_env.config.errors import MgpuError
from mgpu_env.config.settings import (
    DECLARATIONS,
    ResolvedSettings,
    resolve_settings,
)

# Exit codes, documented in the README.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2

SettingFlags = dict[str, str | None]


def _option_help(env: str) -> str:
    declaration = next(d for d in DECLARATIONS if d.env == env)
    default = declaration.default or "empty"
    return f"{declaration.help} (env {env}, default {default})"


def with_settings(
    only: Iterable[str] | None = None, scope: str = "common"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one option per setting; it receives them as `flags` (env name -> text).

    `only` limits the flags to those settings; `scope` adds the settings declared for one
    command (e.g. "bench") to the common ones. The options carry no envvar of their own:
    precedence (flag > environment > env file > default) and validation belong to
    `mgpu_env.config.settings.resolve_settings`.
    """
    wanted = set(only) if only is not None else None

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        declarations = [
            d
            for d in DECLARATIONS
            if (wanted is None or d.env in wanted) and d.scope in ("common", scope)
        ]
        # Resolve string annotations (from __future__ import annotations) to the real
        # Annotated[...] objects, or typer would not see the commands' own typer.Option()s.
        hints = typing.get_type_hints(command, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(command).parameters.values()
            if p.name != "flags"
        ]
        setting_params = [
            inspect.Parameter(
                d.field_name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    str | None,
                    typer.Option(
                        d.flag,
                        help=_option_help(d.env),
                        metavar=d.metavar,
                        show_default=False,
                        rich_help_panel="Settings (flag > environment > .env > default)",
                    ),
                ],
            )
            for d in declarations
        ]
        by_field = {d.field_name: d.env for d in declarations}

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            flags: SettingFlags = {
                by_field[k]: kwargs.pop(k) for k in list(kwargs) if k in by_field
            }
            with exit_codes():
                return command(flags=flags, **kwargs)

        parameters = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own
        ] + setting_params
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        del wrapper.__wrapped__  # typer must see the new signature, not the command's
        return wrapper

    return decorate


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print a user-facing error to stderr and exit with `code`."""
    typer.echo(message, err=True)
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


def resolve(flags: SettingFlags) -> ResolvedSettings:
    """The settings: flag > environment > settings file > default. Raises SettingsErrors."""
    return resolve_settings(flags, os.environ)


@dataclass
class DebugFlag:
    """`mgpu --debug` / MGPU_DEBUG, as the root callback parsed it."""

    enabled: bool = False


DEBUG = DebugFlag()
