"""`mgpu doctor`: the command that judges this machine for training and says the fixes.

`mgpu doctor`: judge the driver, CUDA stack, GPUs, links and container; say the fixes.
`--smoke` also runs a tiny real job on the selected devices (`mgpu_env.doctor.smoke`)."""

# No `from __future__ import annotations` here: with_settings copies the command's
# annotations as they are, and typer must see real Annotated[..., typer.Option] objects.
import json
import os
import re
from dataclasses import dataclass
from typing import Annotated

import typer
from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from entrypoint.options import SettingFlags, resolve, with_settings
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_FAILED, EXIT_OK
from mgpu_env.config.resolve import ResolvedSettings
from mgpu_env.config.settings import SettingsErrors
from mgpu_env.doctor import Diagnosis, SkippedGroup, SmokeResult, diagnose, unusable_settings
from mgpu_env.doctor.report import BugReport, build_report

STYLES = {"ok": "green", "warn": "yellow", "error": "bold red", "skip": "dim"}
LABELS = {"ok": "ok", "warn": "WARN", "error": "ERROR", "skip": "skip"}
GAP = 2  # spaces between the table's columns
# Below this many columns for Found (a narrow terminal) it goes under its row instead.
NARROW_FOUND = 30
# What the wrapper never splits: a `command` in backticks with what touches it
# ("(`make build`),"), else any run of non-spaces (a path, a URL). A user pastes them.
UNBREAKABLE = re.compile(r"(?:[^\s`]*`[^`]*`)+[^\s`]*|\S+")


def wrap_whole(text: str, width: int) -> list[str]:
    """`text` wrapped at `width` between words only, each newline kept: a path or a command
    in backticks is never split, and one longer than `width` gets a line of its own."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in UNBREAKABLE.findall(paragraph):
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


@dataclass(frozen=True)
class Row:
    """One table row: its status, its title, and Found as (text, style) paragraphs; `mark`
    (text, style) ends the last line when it fits there."""

    status: str
    title: str
    found: list[tuple[str, str]]
    mark: tuple[str, str] | None = None


def print_rows(console: Console, header: tuple[str, str, str], rows: list[Row]) -> None:
    """The doctor's table, laid out here rather than by rich: rich folds a word longer than
    its column mid-word, which breaks the paths and commands a user copies."""
    status_width = max(len(header[0]), *(len(LABELS[r.status]) for r in rows)) + GAP
    title_width = max(len(header[1]), *(len(r.title) for r in rows)) + GAP
    indent = status_width + title_width
    beneath = console.width - indent < NARROW_FOUND
    if beneath:
        indent = 4
    width = max(console.width - indent, NARROW_FOUND)
    heading = Text(f"{header[0]:<{status_width}}{header[1]:<{title_width}}{header[2]}",
                   style="bold")
    console.print(heading, soft_wrap=True)
    console.print(Text("\u2500" * console.width, style="dim"), soft_wrap=True)
    for row in rows:
        lines: list[Text] = []
        for text, style in row.found:
            lines += [Text(line, style=style) for line in wrap_whole(text, width)]
        if row.mark is not None:
            mark, style = row.mark
            if len(lines[-1]) + GAP + len(mark) > width:
                lines.append(Text(""))
            lines[-1].append((" " * GAP if lines[-1].plain else "") + mark, style=style)
        first = Text(f"{LABELS[row.status]:<{status_width}}", style=STYLES[row.status])
        first.append(row.title)
        if beneath:
            console.print(first, soft_wrap=True)
        else:
            first.append(" " * (title_width - len(row.title)))
            first.append_text(lines.pop(0))
            first.rstrip()
            console.print(first, soft_wrap=True)
        for line in lines:
            console.print(Text(" " * indent).append_text(line), soft_wrap=True)


def print_wrapped(console: Console, lead: Text, text: str) -> None:
    """`lead` then `text`, wrapped under it without splitting a path or a command."""
    width = max(console.width - len(lead), NARROW_FOUND)
    lines = wrap_whole(text, width)
    # Every line is a Text, never a str: rich would read `[and-cuda]` in a fix as markup and
    # drop it, and the fix on screen must be the fix in --json, character for character.
    console.print(lead.copy().append(lines[0]), soft_wrap=True)
    for line in lines[1:]:
        console.print(Text(" " * len(lead) + line), soft_wrap=True, highlight=False)


def exit_code(diagnosis: Diagnosis, strict: bool) -> int:
    """2: a setting does not fit the machine (GPUS, an impossible MIXED_PRECISION, KERAS,
    the cluster); 1: an error (or a warning with --strict), or
    the smoke job failed."""
    if diagnosis.bad_settings:
        return EXIT_BAD_CONFIG
    return EXIT_FAILED if diagnosis.failing(strict) or diagnosis.smoke_failed else EXIT_OK


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
        table.add_row(Text(LABELS[status], style=STYLES[status]), Text(step.name),
                      f"{step.seconds:.2f} s", Text(step.detail))
    if smoke.error:
        table.add_row(Text(LABELS["error"], style=STYLES["error"]), "job",
                      f"{smoke.seconds:.2f} s", Text(smoke.error))
    print_trimmed(console, table)
    for warning in smoke.warnings:
        line = Text("WARN: ", style=STYLES["warn"])
        line.append(warning)
        console.print(line)
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


def render(diagnosis: Diagnosis, console: Console, strict: bool, verbose: bool = False) -> None:
    """The verdict, a compact table (status, check, found; expected under a finding that is
    off; the checks skipped for one reason as one row unless `verbose`), then the fixes,
    numbered, each listed once."""
    code = exit_code(diagnosis, strict)
    print_trimmed(
        console, Text(diagnosis.verdict(strict), style=STYLES["error"] if code else STYLES["ok"])
    )
    rows: list[Row] = []
    fixes: list[tuple[str, str]] = []  # (fix, status), in first-seen order
    folded = 0
    for item in diagnosis.rows(verbose):
        if isinstance(item, SkippedGroup):
            folded += len(item.checks)
            rows.append(Row("skip", item.title, [(item.reason.why, STYLES["skip"])]))
            continue
        check = item
        found = [(check.found, STYLES["skip"] if check.status == "skip" else "")]
        mark = None
        if check.status in ("warn", "error"):
            if check.expected:
                found.append((f"expected: {check.expected}", "dim"))
            if check.fix:
                if check.fix not in [f for f, _ in fixes]:
                    fixes.append((check.fix, check.status))
                number = [f for f, _ in fixes].index(check.fix) + 1
                mark = (f"fix [{number}]", STYLES[check.status])
        rows.append(Row(check.status, check.title, found, mark))
    print_rows(console, ("Status", "Check", "Found"), rows)
    for number, (fix, status) in enumerate(fixes, start=1):
        print_wrapped(console, Text(f"[{number}] ", style=STYLES[status]), fix)
    errors, warnings = len(diagnosis.errors), len(diagnosis.warnings)
    summary = f"{errors} error(s), {warnings} warning(s)"
    if strict and warnings:
        summary += " (--strict: warnings count as errors)"
    if diagnosis.bad_settings:
        summary += f"; a setting does not fit this machine (exit {EXIT_BAD_CONFIG})"
    if folded:
        summary += f"; --verbose lists the {folded} skipped checks one by one"
    print_wrapped(console, Text(""), summary)
    if diagnosis.smoke is not None:
        render_smoke(diagnosis.smoke, console)


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
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v",
                     help="List every check, also each one skipped for a shared reason."),
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
        _echo_unusable_settings(err, strict)
        raise typer.Exit(code=EXIT_BAD_CONFIG) from None
    diagnosis = diagnose(resolved, os.environ, with_tensorflow=not no_tf, smoke=smoke)
    code = exit_code(diagnosis, strict)
    if as_json:
        _echo_json(diagnosis, resolved, strict=strict, code=code, bug_report=bug_report)
    elif bug_report:
        typer.echo(render_markdown(build_report(diagnosis, resolved, os.environ, strict=strict)))
    else:
        render(diagnosis, Console(), strict, verbose)
    raise typer.Exit(code=code)


def _echo_unusable_settings(err: SettingsErrors, strict: bool) -> None:
    """--json with settings that cannot be used: a CI parser reads stdout, so it gets JSON
    that says why nothing was checked; the reasons go to stderr too."""
    data = unusable_settings(err.errors)
    data["summary"].update(strict=strict, exit_code=EXIT_BAD_CONFIG)
    typer.echo(json.dumps(data, indent=2))
    typer.echo(err.user_message(), err=True)


def _echo_json(
    diagnosis: Diagnosis, resolved: ResolvedSettings, *, strict: bool, code: int, bug_report: bool
) -> None:
    """--json: the checks, the raw facts, the exit code and (with --report) the bug report."""
    data = diagnosis.to_dict(strict)
    data["summary"]["strict"] = strict
    data["summary"]["exit_code"] = code
    data["settings_warnings"] = list(resolved.warnings)
    if bug_report:
        data["report"] = build_report(diagnosis, resolved, os.environ, strict=strict).to_dict()
    typer.echo(json.dumps(data, indent=2, default=str))


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
        lines += ["", "### Findings", *[f"- {status.upper()} {title}: "
                                        + found.replace("\n", " | ")
                                        for status, title, found in report.problems]]
    lines += ["", "</details>"]
    return "\n".join(lines)
