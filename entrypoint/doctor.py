"""`mgpu doctor`: judge the driver, CUDA stack, GPUs, links and container; say the fixes.
`--smoke` also runs a tiny real job on the selected devices (`mgpu_env.doctor.smoke`)."""

# No `from __future__ import annotations` here: with_settings copies the command's
# annotations as they are, and typer must see real Annotated[..., typer.Option] objects.
import json
import os
from typing import Annotated

import typer
from rich import box
from rich.console import Console, RenderableType
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
from mgpu_env.config.settings import SettingsErrors
from mgpu_env.doctor import Report, SmokeResult, diagnose, unusable_settings
from mgpu_env.doctor.report import BugReport, build_report

STYLES = {"ok": "green", "warn": "yellow", "error": "bold red", "skip": "dim"}
LABELS = {"ok": "ok", "warn": "WARN", "error": "ERROR", "skip": "skip"}


def exit_code(report: Report, strict: bool) -> int:
    """2: a setting does not fit the machine; 1: an error (or a warning with --strict), or
    the smoke job failed."""
    if report.bad_settings:
        return EXIT_BAD_CONFIG
    return EXIT_FAILED if report.failing(strict) or report.smoke_failed else EXIT_OK


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
    print_trimmed(console, table)
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


def print_trimmed(console: Console, renderable: RenderableType) -> None:
    """Print without the spaces rich pads each table line with: invisible on a terminal,
    but noise in a log or a diff."""
    with console.capture() as captured:
        console.print(renderable)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    console.file.write(text + "\n")
    console.file.flush()


def render(report: Report, console: Console, strict: bool) -> None:
    """The verdict, a compact table (status, check, found; expected under a finding that is
    off), then the fixes, numbered, each listed once."""
    code = exit_code(report, strict)
    print_trimmed(
        console, Text(report.verdict(strict), style=STYLES["error"] if code else STYLES["ok"])
    )
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
    print_trimmed(console, table)
    for number, (fix, status) in enumerate(fixes, start=1):
        line = Text(f"[{number}] ", style=STYLES[status])
        line.append(fix)
        print_trimmed(console, line)
    errors, warnings = len(report.errors), len(report.warnings)
    summary = f"{errors} error(s), {warnings} warning(s)"
    if strict and warnings:
        summary += " (--strict: warnings count as errors)"
    if report.bad_settings:
        summary += "; GPUS does not fit this machine (exit 2)"
    print_trimmed(console, Text(summary, style=STYLES["error"] if code else STYLES["ok"]))
    if report.smoke is not None:
        render_smoke(report.smoke, console)


@with_settings(
    only=("GPUS", "MIXED_PRECISION", "XLA", "VIRTUAL_DEVICES", "CROSS_DEVICE_OPS", "ENV_FILE")
)
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
    bug_report: Annotated[
        bool,
        typer.Option("--report", help="Print a Markdown block to paste into a bug report "
                                       "(versions, GPUs, packages, settings; secrets masked)."),
    ] = False,
) -> None:
    """Check driver, CUDA, cuDNN, GPUs, links and the container; say how to fix problems.

    Exit 0 no errors, 1 an error (or, with --strict, a warning; or the --smoke job
    failed), 2 a bad setting.
    """
    try:
        resolved = resolve(flags)
    except SettingsErrors as err:
        if not as_json:
            raise
        # A CI parser reads stdout: it gets JSON that says why nothing was checked.
        data = unusable_settings(err.errors)
        data["summary"].update(strict=strict, exit_code=EXIT_BAD_CONFIG)
        typer.echo(json.dumps(data, indent=2))
        typer.echo(err.user_message(), err=True)
        raise typer.Exit(code=EXIT_BAD_CONFIG) from None
    report = diagnose(resolved, os.environ, with_tensorflow=not no_tf, smoke=smoke)
    code = exit_code(report, strict)
    if as_json:
        data = report.to_dict(strict)
        data["summary"]["strict"] = strict
        data["summary"]["exit_code"] = code
        data["settings_warnings"] = list(resolved.warnings)
        if bug_report:
            data["report"] = build_report(report, resolved, os.environ, strict=strict).to_dict()
        typer.echo(json.dumps(data, indent=2, default=str))
    elif bug_report:
        typer.echo(render_markdown(build_report(report, resolved, os.environ, strict=strict)))
    else:
        render(report, Console(), strict)
    raise typer.Exit(code=code)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(report: BugReport) -> str:
    """The bug report as Markdown: headed bullet lists and tables, inside <details> so a
    long report stays folded in an issue."""
    about = report.about
    lines = [
        "<details><summary>mgpu doctor --report: " + report.verdict + "</summary>",
        "",
        "### mgpu",
        f"- mgpu: {about.mgpu}",
        f"- image: {about.image_tag or 'not in the image (MGPU_IMAGE_TAG unset)'}",
        f"- verdict: {report.verdict}",
        "",
        "### System",
        *[f"- {key}: {value}" for key, value in report.system.items()],
        "",
        "### TensorFlow",
        *[f"- {key}: {value}" for key, value in report.tensorflow.items()],
        "",
        "### Driver and GPUs",
        *[f"- {key}: {value}" for key, value in report.driver.items()],
        f"- NCCL: {report.nccl}",
    ]
    if report.gpus:
        lines += ["", *_table(
            ("GPU", "name", "memory", "compute capability", "MIG", "used"),
            [(str(g.index), g.name, g.memory, g.compute_capability, g.mig,
              "yes" if g.used else "no") for g in report.gpus],
        )]
    else:
        lines.append("- GPUs: none found")
    lines += ["", "### Packages that differ from requirements.lock"]
    packages = report.packages
    if not packages.ok or packages.value is None:
        lines.append(f"- {packages.text()}")
    elif not packages.value:
        lines.append("- none: every locked package is installed at its locked version")
    else:
        lines += _table(("package", "locked", "installed"),
                        [(p.name, p.locked, p.installed or "not installed")
                         for p in packages.value])
    lines += ["", "### Settings", *_table(
        ("setting", "value", "source"),
        [(name, entry["value"] or "(empty)", entry["source"])
         for name, entry in report.settings.items()],
    )]
    if report.environment:
        lines += ["", "### Environment", "```",
                  *[f"{name}={value}" for name, value in report.environment.items()], "```"]
    if report.problems:
        lines += ["", "### Findings", *[f"- {status.upper()} {title}: {found}"
                                        for status, title, found in report.problems]]
    lines += ["", "</details>"]
    return "\n".join(lines)
