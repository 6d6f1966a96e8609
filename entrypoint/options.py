"""Turning the library's setting declarations into typer options, and failing cleanly.

Each setting is declared once, in `mgpu_env.config.settings.Settings`; `with_settings` adds one
`--flag` per declaration to a command, so `mgpu train --help` lists every setting with its
env var and default, and a new setting needs no change here.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, NoReturn

import typer

from mgpu_env.config.errors import MgpuError
from mgpu_env.config.settings import (
    DECLARATIONS,
    ResolvedSettings,
    SettingError,
    SettingsErrors,
    parse_bool,
    resolve_settings,
)
from mgpu_env.runtime import prepare_environment

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
            # The library's user-facing errors end here, as one message and their exit
            # code, whether the command runs from `mgpu` or from typer's test runner.
            try:
                return command(flags=flags, **kwargs)
            except SettingsErrors as err:
                fail("\n".join(f"error: {e}" for e in err.errors), EXIT_BAD_CONFIG)
            except MgpuError as err:
                if debug_enabled():
                    raise
                fail(f"error: {err}", err.exit_code)

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


def resolve_or_exit(flags: SettingFlags) -> ResolvedSettings:
    """Resolve the settings (exit 2 on bad values, before anything slow); export the
    settings file's other variables."""
    try:
        resolved = resolve_settings(flags, os.environ)
    except SettingsErrors as err:
        fail("\n".join(f"error: {e}" for e in err.errors), EXIT_BAD_CONFIG)
    prepare_environment(resolved)
    return resolved


def debug_enabled() -> bool:
    try:
        from_env = parse_bool(os.environ.get("MGPU_DEBUG", ""))
    except SettingError:
        from_env = False
    return from_env or "--debug" in sys.argv
