"""`mgpu bench`: the command that measures how training scales with replicas.

It reports samples/s and scaling efficiency against replicas, writes bench.json and a plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from entrypoint.options import SettingFlags, fail, resolve, with_settings
from mgpu_env.api import start_process
from mgpu_env.bench.plot import plot_bench
from mgpu_env.bench.sweep import BENCH_PNG, plan_as_dict, plan_bench, run_bench, write_results
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_FAILED
from mgpu_env.runtime.runfolder import run_folder

PROFILE_DIR = "profile"  # BENCH_EXPLAIN's traces: tensorboard --logdir <OUTPUT_DIR>/profile
ExplainOption = Annotated[bool, typer.Option(
    "--explain", help="Also profile each point: where the step's time goes, the all-reduce "
    "predicted, the bottleneck and its fix (short for --bench-explain, BENCH_EXPLAIN=1).")]

DryRunOption = Annotated[bool, typer.Option(
    "--dry-run", help="Print the sweep's plan (its devices, each point's replicas, devices, "
    "precision and Keras) and exit; nothing is measured or written.")]
JsonOption = Annotated[bool, typer.Option(
    "--json", help="With --dry-run: print the plan as one JSON object.")]

PIPED_WIDTH = 200  # wider than any table mgpu bench prints


@with_settings(scope="bench")
def command(flags: SettingFlags, explain: ExplainOption = False, dry_run: DryRunOption = False,
            as_json: JsonOption = False) -> None:
    """Sweep replica counts (and precision, XLA, data) and measure throughput and efficiency.

    Each replica count runs in its own process: warm-up steps, then BENCH_INTERVALS rounds
    of one timed interval of BENCH_STEPS steps per data variant, in turns. Writes
    bench.json and bench.png under OUTPUT_DIR.
    """
    if as_json and not dry_run:
        fail("error: --json goes with --dry-run (a sweep's results are in bench.json).",
             EXIT_BAD_CONFIG)
    if explain:
        flags["BENCH_EXPLAIN"] = "1"  # the flag's short name: the setting decides the rest
    runtime = start_process(resolve(flags), "bench")  # a GPU the machine lacks: exit 2
    if dry_run:
        print_plan(plan_as_dict(runtime, *plan_bench(runtime)), as_json)  # too wide: exit 2
        return
    settings = runtime.settings
    output_dir = run_folder(settings, "bench")
    err_console = Console(stderr=True)

    def progress(point: dict[str, Any], done: int, total: int) -> None:
        what = f"[{done}/{total}] {point['replicas']} replica(s), {point['variant']}"
        if point.get("error"):
            err_console.print(f"{what}: [red]failed[/red]")
        else:
            err_console.print(f"{what}: {point['samples_per_s']['median']:,.0f} samples/s")

    results = run_bench(runtime, on_point=progress, profile_root=output_dir / PROFILE_DIR)
    data = results.as_dict()
    json_path = write_results(results, output_dir)
    png_path = plot_bench(data, output_dir / BENCH_PNG)

    # Piped (a batch system's output file), rich would wrap the table at 80 columns; a
    # log file has no width, so it gets the table's own.
    console = Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH, soft_wrap=True)
    console.print(render_table(data))
    for note in data["notes"]:
        console.print(f"note: {note}")
    if data["input_pipeline_cost"]:
        console.print(render_costs(data["input_pipeline_cost"]))
    if data["input_alone"]:
        alone = render_input_alone(data["input_alone"])
        if alone.row_count:
            console.print(alone)
        for verdict in data["input_alone"]:
            console.print(input_alone_line(verdict))
    if data["seed_comparison"] is not None:
        console.print(comparison_line(data["seed_comparison"]))
    if settings.bench_explain:
        print_explain(console, data, output_dir / PROFILE_DIR)
    console.print(f"wrote {json_path} and {png_path}")
    for point in results.failed:
        typer.echo(f"error: {point['error']}", err=True)
    if results.failed:
        raise typer.Exit(code=EXIT_FAILED)


def comparison_line(comparison: dict[str, Any]) -> str:
    """BENCH_COMPARE: the tutorial's plain model.fit against mgpu's step, or why it failed."""
    if comparison.get("ratio") is None:
        return f"comparison with the tutorial's model.fit failed: {comparison.get('error')}"
    return (
        f"the tutorial's plain model.fit: {comparison['seed_samples_per_s']:,.0f} samples/s; "
        f"mgpu: {comparison['mgpu_samples_per_s']:,.0f} samples/s; "
        f"mgpu/model.fit = {comparison['ratio']:.2f}x (1 replica, fp32, MLP, same data)"
    )


def print_plan(plan: dict[str, Any], as_json: bool) -> None:
    """--dry-run: the sweep's plan as JSON, or a line per point."""
    if as_json:
        typer.echo(json.dumps(plan, indent=2))
        return
    for point in plan["points"]:
        typer.echo(f"{point['replicas']} replica(s), {point['variant']}: "
                   f"{', '.join(point['devices'])}, {point['precision']}, "
                   f"Keras {point['keras']}")


def render_table(data: dict[str, Any]) -> Table:
    """One row per point: throughput with its spread, per replica, step time, efficiency."""
    devices = data["devices"]
    kind = f"logical {devices['kind']}" if devices["logical"] else devices["kind"]
    variants = list(dict.fromkeys(p["variant"] for p in data["points"]))
    model = data["points"][0]["model"] if data["points"] else data["settings"].get(
        "BENCH_MODEL", "")
    title = f"mgpu bench: {model}, {kind} devices"
    if len(variants) == 1:
        title += f", {variants[0]}"
    table = Table(title=title, caption="samples/s: median over timed intervals; IQR: "
                  "q3-q1; ±: the median's 95% confidence (1.58 x IQR / sqrt(intervals)); "
                  "eff.: samples/s / (n x samples/s at base)")
    columns = ["variant"] if len(variants) > 1 else []
    _add_columns(table, *columns, "n", "batch", "samples/s", "IQR", "±", "/replica",
                 "step ms", "eff.")
    for point in data["points"]:
        row = [point["variant"]] if len(variants) > 1 else []
        row += [str(point["replicas"]), str(point["global_batch"])]
        if point.get("error"):
            table.add_row(*row, "failed", "", "", "", "", "")
            continue
        samples = point["samples_per_s"]
        table.add_row(
            *row,
            f"{samples['median']:,.0f}",
            f"{samples['iqr']:,.0f}",
            f"±{samples['median_ci95']:,.0f}",
            f"{point['samples_per_s_per_replica']:,.0f}",
            f"{point['step_time_ms']['median']:.2f}",
            f"{100 * point['efficiency']:.0f}%",
        )
    return table


KIND_SHOWN = {"waiting": "waiting", "cpu": "CPU", "step": "in step", "none": "none",
              "unexplained": "?"}


def render_costs(costs: list[dict[str, Any]]) -> Table:
    """The input pipeline's cost, one row per data point: median over rounds and range."""
    table = Table(title="input pipeline's cost: samples/s lost against synthetic",
                  caption="lost: 1 - samples/s / synthetic's in the same round, median "
                  "over the rounds; ±: its 95% confidence (1.58 x IQR / sqrt(rounds)); "
                  "rounds: lowest to highest; noise?: yes when ± reaches 0 (under 6 "
                  "rounds, also when they do not all agree)")
    waits = any("profiled_input_cost" in cost for cost in costs)
    kinds = any(cost.get("input_cost_kind") for cost in costs)
    _add_columns(table, "variant", "n", "lost", "±", "rounds", "ms/step", "noise?",
                 *(["profiled"] if waits else []), *(["how"] if kinds else []))
    if waits:
        table.caption = f"{table.caption}; profiled: the input's share as TensorFlow's " \
            "profiler reads it in traced intervals of the same feed (--explain), beyond " \
            "synthetic's: the steps' wait for input, plus on CPU devices the share of the " \
            "cores tf.data's threads took"
    if kinds:
        table.caption = f"{table.caption}; how (the reading that accounts for the loss " \
            "within 5 points): waiting (the step waits for its input), CPU (the input's " \
            "threads take the cores the step computes on), in step (as much more CPU per " \
            "sample, but not in the pipeline's threads: the step itself takes longer on " \
            "this data than on synthetic's one batch), none, or ? (no reading accounts)"
    for cost in costs:
        lost = cost["throughput_lost_spread"]
        wait = cost.get("profiled_input_cost")
        table.add_row(
            cost["variant"], str(cost["replicas"]), f"{100 * cost['throughput_lost']:.1f}%",
            f"{100 * cost['throughput_lost_ci95']:.1f}",
            f"{100 * lost['minimum']:.0f} to {100 * lost['maximum']:.0f}%",
            f"{cost['step_time_added_ms']:+.2f}", "no" if cost["significant"] else "yes",
            *([] if not waits else ["-" if wait is None else f"{100 * wait:.1f}%"]),
            *([] if not kinds else [KIND_SHOWN.get(cost.get("input_cost_kind") or "", "-")]),
        )
    return table


def render_input_alone(verdicts: list[dict[str, Any]]) -> Table:
    """What each streamed input gave with no step, against what the step takes."""
    rows = [row for verdict in verdicts for row in verdict.get("by_replicas", ())]
    caption = "step: samples/s of synthetic data (the step with its input free)"
    if any(row["step_from"] != "synthetic" for row in rows):
        caption += "; *: no synthetic point, the streamed point's own"
    table = Table(title="input alone: samples/s with no step, against the step's",
                  caption=caption)
    _add_columns(table, "variant", "n", "input alone", "step", "keeps up")
    for verdict in verdicts:
        for row in verdict.get("by_replicas", ()):
            table.add_row(
                verdict["variant"], str(row["replicas"]),
                f"{row['input_alone_samples_per_s']:,.0f}", f"{row['step_samples_per_s']:,.0f}"
                + ("" if row["step_from"] == "synthetic" else "*"),
                "yes" if row["keeps_up"] else "no",
            )
    return table


def input_alone_line(verdict: dict[str, Any]) -> str:
    """One line per data variant: whether its input keeps up with the replicas measured
    (the numbers are in the table above it)."""
    what = f"input alone, {verdict['variant']}:"
    if not verdict["measured"]:
        return f"{what} {verdict['skipped']}"
    if verdict["keeps_up"]:
        counts = [str(row["replicas"]) for row in verdict["by_replicas"]]
        listed = ", ".join(counts[:-1]) + " and " + counts[-1] if len(counts) > 1 else counts[0]
        return f"{what} keeps up with the step at {listed} replica(s)"
    return f"{what} limits the step from {verdict['limits_from']} replica(s)"


EXPLAIN_COLUMNS = (("compile", ("compilation",)), ("input", ("input",)),
                   ("dev. compute", ("device_compute",)),
                   ("collect.", ("collectives", "device_to_device")),
                   ("launch", ("kernel_launch",)), ("host", ("host_compute",)),
                   ("other", ("output", "other")))


def print_explain(console: Console, data: dict[str, Any], profiles: Path) -> None:
    """BENCH_EXPLAIN: the split's table, a line per point, where the traces are."""
    console.print(render_explain(data))
    for line in explain_lines(data):
        console.print(line)
    console.print(f"profiles: tensorboard --logdir {profiles}")


def render_explain(data: dict[str, Any]) -> Table:
    """BENCH_EXPLAIN: each point's profiled step split into the profiler's categories (% of
    the step), the all-reduce predicted and measured, and the bottleneck."""
    table = Table(title="where the step's time goes (TensorFlow's profiler, xprof's split)",
                  caption="% of the profiled step; collect.: collectives and device copies "
                  "(on CPU devices the profiler counts them as host compute); all-reduce: "
                  "predicted 2(n-1)/n x gradient bytes / busbw")
    _add_columns(table, "variant", "n", "step ms", *(name for name, _ in EXPLAIN_COLUMNS),
                 "all-reduce ms", "measured ms", "bottleneck")
    for point in data["points"]:
        explained = point.get("explain") or {}
        split = explained.get("split")
        if not split:
            continue
        shares = [sum(split["share"][key] for key in keys) for _, keys in EXPLAIN_COLUMNS]
        predicted = explained.get("allreduce", {}).get("seconds")
        measured = explained.get("collectives_measured_ms")
        table.add_row(
            point["variant"], str(point["replicas"]), f"{split['step_ms']:.2f}",
            *(f"{100 * share:.0f}%" for share in shares),
            "-" if predicted is None else f"{1000 * predicted:.3f}",
            "n/a" if measured is None else f"{measured:.3f}",
            explained["verdict"]["bottleneck"],
        )
    return table


def explain_lines(data: dict[str, Any]) -> list[str]:
    """Per explained point: why the bottleneck, what helps, the efficiency against the
    reference; or why the profile could not be split."""
    lines = []
    for point in data["points"]:
        explained = point.get("explain")
        if not explained:
            continue
        what = f"{point['replicas']} replica(s), {point['variant']}:"
        if "verdict" not in explained:
            lines.append(f"{what} {explained.get('error', 'not profiled')}")
            continue
        verdict = explained["verdict"]
        line = f"{what} {verdict['bottleneck']}: {verdict['why']}; helps: {verdict['fixes'][0]}"
        if explained.get("reference"):
            line += f"; efficiency {explained['reference']}"
        lines.append(line)
        if estimated := explained.get("memory_estimate"):
            peaks = ", ".join(f"{name} {peak / 2**20:,.0f} MiB" for name, peak in
                              explained.get("peak_memory_bytes", {}).items())
            lines.append(f"  memory per replica: estimated {estimated['total'] / 2**20:,.0f} MiB"
                         + (f"; measured peak {peaks}" if peaks else ""))
        if explained.get("call_share"):
            lines.append(
                f"  one step per call took {explained['unprofiled_step_ms']:.2f} ms unprofiled, "
                f"the timed loop {explained['loop_step_ms']:.2f} ms per step: "
                f"{100 * explained['call_share']:.0f}% of a lone step is its call, which the "
                "loop's many steps per call spread out")
    return lines


def _add_columns(table: Table, *names: str) -> None:
    """Numbers right-aligned; the variant's name folded when the terminal is narrow."""
    for name in names:
        if name == "variant":
            table.add_column(name, overflow="fold")
        else:
            table.add_column(name, justify="right")
