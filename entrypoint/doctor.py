"""`mgpu doctor`: judge the driver, CUDA, cuDNN, GPUs, links and container; say the fixes."""

# No `from __future__ import annotations` here: with_settings copies the command's
# annotations as they are, and typer must see real Annotated[..., typer.Option] objects.
import json
import os
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from entrypoint.options import (
    EXIT_BAD_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    SettingFlags,
    resolve,
    with_settings,
)
from mgpu_env.doctor import Report, diagnose

STYLES = {"ok": "green", "warn": "yellow", "error": "bold red", "skip": "dim"}
LABELS = {"ok": "ok", "warn": "WARN", "error": "ERROR", "skip": "skip"}


def exit_code(report: Report, strict: bool) -> int:
    """2: a setting does not fit the machine; 1: an error (or a warning with --strict)."""
    if report.bad_settings:
        return EXIT_BAD_CONFIG
    return EXIT_FAILED if report.failing(strict) else EXIT_OK


def render(report: Report, console: Console, strict: bool) -> None:
    """A compact table (status, check, found; expected under a finding that is off), then
    the fixes, numbered, each listed once."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("Status", no_wrap=True)
    table.add_column("Check", no_wrap=True)
    table.add_column("Found", overflow="fold")
    fixes: list[tuple[str, str]] = []  # (fix, status), in first-seen order
    for check in report.checks:
        found = Text(check.found, style="dim" if check.status == "skip" else "")
        if check.status in ("warn", "error"):
            if check.expected:
                found.append(f"\nexpected: {check.expected}", style="dim")
            if check.fix:
                if check.fix not in [f for f, _ in fixes]:
                    fixes.append((check.fix, check.status))
                number = [f for f, _ in fixes].index(check.fix) + 1
                found.append(f"  fix [{number}]", style=STYLES[check.status])
        table.add_row(
            Text(LABELS[check.status], style=STYLES[check.status]), check.title, found
        )
    console.print(table)
    for number, (fix, status) in enumerate(fixes, start=1):
        line = Text(f"[{number}] ", style=STYLES[status])
        line.append(fix)
        console.print(line)
    errors, warnings = len(report.errors), len(report.warnings)
    code = exit_code(report, strict)
    summary = f"{errors} error(s), {warnings} warning(s)"
    if strict and warnings:
        summary += " (--strict: warnings count as errors)"
    if report.bad_settings:
        summary += "; GPUS does not fit this machine (exit 2)"
    console.print(Text(summary, style=STYLES["error"] if code else STYLES["ok"]))


@with_settings(only=("GPUS", "MIXED_PRECISION", "ENV_FILE"))
def command(
    flags: SettingFlags,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: checks and raw facts.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings count as errors.")] = False,
    no_tf: Annotated[
        bool,
        typer.Option("--no-tf", help="Skip the TensorFlow part (NVML and host only: < 1 s)."),
    ] = False,
) -> None:
    """Check driver, CUDA, cuDNN, GPUs, links and the container; say how to fix problems.

    Exit 0 no errors, 1 an error (or, with --strict, a warning), 2 a bad setting.
    """
    report = diagnose(resolve(flags), os.environ, with_tensorflow=not no_tf)
    code = exit_code(report, strict)
    if as_json:
        data = report.to_dict()
        data["summary"]["strict"] = strict
        data["summary"]["exit_code"] = code
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        render(report, Console(), strict)
    raise typer.Exit(code=code)
