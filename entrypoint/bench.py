"""`mgpu bench`: samples/s and scaling efficiency against replicas; bench.json and a plot."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from entrypoint.options import EXIT_FAILED, SettingFlags, resolve, with_settings
from mgpu_env.bench.plot import plot_bench
from mgpu_env.bench.sweep import BENCH_PNG, default_output_dir, run_bench, write_report
from mgpu_env.runtime import build_runtime

PIPED_WIDTH = 200  # wider than any table mgpu bench prints


@with_settings(scope="bench")
def command(flags: SettingFlags) -> None:
    """Sweep replica counts (and precision, XLA, data) and measure throughput and efficiency.

    Each point runs in its own process: warm-up steps, then BENCH_INTERVALS timed intervals
    of BENCH_STEPS steps. Writes bench.json and bench.png under OUTPUT_DIR.
    """
    runtime = build_runtime(resolve(flags), command="bench")  # a GPU the machine lacks: exit 2
    runtime.apply()
    settings = runtime.settings
    output_dir = default_output_dir(settings)
    err_console = Console(stderr=True)

    def progress(point: dict[str, Any], done: int, total: int) -> None:
        what = f"[{done}/{total}] {point['replicas']} replica(s), {point['variant']}"
        if point.get("error"):
            err_console.print(f"{what}: [red]failed[/red]")
        else:
            err_console.print(f"{what}: {point['samples_per_s']['median']:,.0f} samples/s")

    report = run_bench(runtime, on_point=progress)
    data = report.as_dict()
    json_path = write_report(report, output_dir)
    png_path = plot_bench(data, output_dir / BENCH_PNG)

    # Piped (a batch system's output file), rich would wrap the table at 80 columns; a
    # log file has no width, so it gets the table's own.
    console = Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH, soft_wrap=True)
    console.print(render_table(data))
    for note in data["notes"]:
        console.print(f"note: {note}")
    for cost in data["input_pipeline_cost"]:
        what = (f"input pipeline, {cost['data']} data ({cost['replicas']} replica(s), "
                f"{cost['precision']}): ")
        if cost["significant"] and cost["throughput_lost"] > 0:
            console.print(
                f"{what}{100 * cost['throughput_lost']:.1f}% of synthetic throughput lost, "
                f"{cost['step_time_added_ms']:+.2f} ms per step"
            )
        else:
            console.print(
                f"{what}no cost measurable: real vs synthetic data differ by "
                f"{-100 * cost['throughput_lost']:+.1f}%, within the noise of the intervals"
            )
    comparison = data["seed_comparison"]
    if comparison is not None:
        if comparison.get("ratio") is None:
            console.print("comparison with the tutorial's model.fit failed: "
                          f"{comparison.get('error')}")
        else:
            console.print(
                f"the tutorial's plain model.fit: {comparison['seed_samples_per_s']:,.0f} "
                "samples/s; "
                f"mgpu: {comparison['mgpu_samples_per_s']:,.0f} samples/s; "
                f"mgpu/model.fit = {comparison['ratio']:.2f}x (1 replica, fp32, MLP, same data)"
            )
    console.print(f"wrote {json_path} and {png_path}")
    for point in report.failed:
        typer.echo(f"error: {point['error']}", err=True)
    if report.failed:
        raise typer.Exit(code=EXIT_FAILED)


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
                  "q3-q1; CI: 95% of the mean; eff.: samples/s / (n x samples/s at base)")
    columns = ["variant"] if len(variants) > 1 else []
    columns += ["n", "batch", "samples/s", "IQR", "CI", "/replica", "step ms", "eff."]
    for name in columns:
        if name == "variant":
            table.add_column(name, overflow="fold")
        else:
            table.add_column(name, justify="right")
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
            f"±{samples['ci95']:,.0f}",
            f"{point['samples_per_s_per_replica']:,.0f}",
            f"{point['step_time_ms']['median']:.2f}",
            f"{100 * point['efficiency']:.0f}%",
        )
    return table
