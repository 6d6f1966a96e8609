"""`mgpu doctor`: judge the driver, CUDA stack, GPUs, links and container; say the fixes.
`--smoke` also runs a tiny real job on the selected devices (`mgpu_env.doctor.smoke`)."""

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
from mgpu_env.doctor import Report, SmokeResult, diagnose

STYLES = {"ok": "green", "warn": "yellow", "error": "bold red", "skip": "dim"}
LABELS = {"ok": "ok", "warn": "WARN", "error": "ERROR", "skip": "skip"}


def exit_code(report: Report, strict: bool) -> int:
    """2: a setting does not fit the machine; 1: an error (or a warning with --strict), or
    the smoke job failed."""
    if report.bad_settings:
        return EXIT_BAD_CONFIG
    smoke_failed = report.smoke is not None and not report.smoke.ok
    return EXIT_FAILED if report.failing(strict) or smoke_failed else EXIT_OK


def render_smoke(smoke: SmokeResult, console: Console) -> None:
    """The smoke job: one row per step with its time, then its fixes."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  title="Smoke job (--smoke)", title_justify="left")
    table.add_column("Status", no_wrap=True)
    table.add_column("Step", no_wrap=True)
    table.add_column("Time", no_wrap=True, justify="right")
    table.add_column("Found", overflow="fold")
    for step in smoke.steps:
        status = "ok" if step.ok else "error"
        table.add_row(Text(LABELS[status], style=STYLES[status]), step.name,
                      f"{step.seconds:.2f} s", step.detail)
    if smoke.error:
        table.add_row(Text(LABELS["error"], style=STYLES["error"]), "job",
                      f"{smoke.seconds:.2f} s", smoke.error)
    console.print(table)
    for fix in smoke.failures:
        line = Text("fix: ", style=STYLES["error"])
        line.append(fix)
        console.print(line)
    verdict = (
        f"smoke job passed on {len(smoke.devices)} {smoke.device_type} replica(s) "
        f"({smoke.cross_device_ops}, {smoke.policy}) in {smoke.seconds:.1f} s"
        if smoke.ok else "smoke job FAILED"
    )
    console.print(Text(verdict, style=STYLES["ok"] if smoke.ok else STYLES["error"]))


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
    if report.smoke is not None:
        render_smoke(report.smoke, console)


@with_settings(only=("GPUS", "MIXED_PRECISION", "XLA", "VIRTUAL_DEVICES", "CROSS_DEVICE_OPS"))
def command(
    flags: SettingFlags,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: checks and raw facts.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings count as errors.")] = False,
    no_tf: Annotated[
        bool,
        typer.Option(
            "--no-tf",
            help="Skip TensorFlow and its CUDA libraries (NVML and host only: < 1 s).",
        ),
    ] = False,
    smoke: Annotated[
        bool,
        typer.Option(
            "--smoke",
            help="Also run a tiny real job on the selected devices (all-reduce, XLA, matmul) "
            "in a child process with a timeout.",
        ),
    ] = False,
) -> None:
    """Check driver, CUDA, cuDNN, GPUs, links and the container; say how to fix problems.

    Exit 0 no errors, 1 an error (or, with --strict, a warning; or the --smoke job
    failed), 2 a bad setting.
    """
    report = diagnose(resolve(flags), os.environ, with_tensorflow=not no_tf, smoke=smoke)
    code = exit_code(report, strict)
    if as_json:
        data = report.to_dict()
        data["summary"]["strict"] = strict
        data["summary"]["exit_code"] = code
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        render(report, Console(), strict)
    raise typer.Exit(code=code)
