"""The bench plot: throughput and scaling efficiency against replicas, with the ideal lines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgpu_env.training.run import rundir

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def plot_bench(results: dict[str, Any], path: Path) -> Path:
    """Draw bench.json's content (`draw_bench`) to a PNG at `path`."""
    import matplotlib.pyplot as plt

    fig = draw_bench(results)
    try:
        rundir.atomic_save(path, lambda temp: fig.savefig(temp, dpi=100, format="png"), ".png")
    finally:
        plt.close(fig)
    return path


def draw_bench(results: dict[str, Any]) -> Figure:
    """Two panels, one series per variant; the caller saves and closes the figure.

    Left: median samples/s against replicas, with the interquartile range as error bars
    and the ideal line n x throughput(base). Right: scaling efficiency in percent, with
    100% as the ideal. Every axis starts at 0, so the heights compare as ratios (an axis
    from 20,000 makes 25,000 look twice 22,500).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display in containers and CI
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, Any]]] = {}
    for point in results.get("points", []):
        if not point.get("error"):
            series.setdefault(point["variant"], []).append(point)

    explained = [p for p in results.get("points", [])
                 if not p.get("error") and (p.get("explain") or {}).get("split")]
    if explained:
        fig, (ax_tp, ax_eff, ax_split) = plt.subplots(1, 3, figsize=(16.5, 4.5))
        _draw_split(ax_split, explained)
    else:
        fig, (ax_tp, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.5))
    all_replicas: set[int] = set()
    for index, (variant, points) in enumerate(sorted(series.items())):
        all_replicas.update(_draw_variant(ax_tp, ax_eff, index, variant, points))
    ax_eff.axhline(100.0, linestyle="--", color="grey", label="ideal")
    _label_axes(results, (ax_tp, ax_eff), sorted(all_replicas), legend=bool(series))
    points = results.get("points") or [{}]
    model = points[0].get("model") or results.get("settings", {}).get("BENCH_MODEL", "")
    fig.suptitle(f"mgpu bench: {model}, weak scaling (global batch = batch x replicas)")
    fig.tight_layout()
    return fig


def _draw_variant(
    ax_tp: Axes, ax_eff: Axes, index: int, variant: str, points: list[dict[str, Any]]
) -> list[int]:
    """One variant's series on both panels, in colour `index`; returns its replica counts."""
    points = sorted(points, key=lambda p: p["replicas"])
    replicas = [p["replicas"] for p in points]
    medians = [p["samples_per_s"]["median"] for p in points]
    low = [p["samples_per_s"]["median"] - p["samples_per_s"]["q1"] for p in points]
    high = [p["samples_per_s"]["q3"] - p["samples_per_s"]["median"] for p in points]
    color = f"C{index % 10}"
    ax_tp.errorbar(replicas, medians, yerr=[low, high], marker="o", capsize=3,
                   color=color, label=variant)
    base_n, base_tp = replicas[0], medians[0]
    ax_tp.plot(replicas, [base_tp * n / base_n for n in replicas], linestyle="--",
               color=color, alpha=0.5,
               label="ideal: n x base (dashed)" if index == 0 else None)
    ax_eff.plot(replicas, [100.0 * p["efficiency"] for p in points], marker="o",
                color=color, label=variant)
    return replicas


def _draw_split(ax: Axes, points: list[dict[str, Any]]) -> None:
    """BENCH_EXPLAIN: one stacked bar per point, the profiled step's milliseconds in each of
    the profiler's categories."""
    from mgpu_env.profile.split import CATEGORIES

    labels = [f"{p['replicas']}x {p['variant']}" for p in points]
    bottoms = [0.0] * len(points)
    for index, (key, _, name) in enumerate(CATEGORIES):
        values = [p["explain"]["split"]["ms"][key] for p in points]
        if not any(values):
            continue
        ax.bar(labels, values, bottom=bottoms, label=name, color=f"C{index % 10}")
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_ylabel("ms per profiled step")
    ax.set_title("Where the step's time goes (TensorFlow's profiler)")
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize="small")


def _label_axes(
    results: dict[str, Any], axes: tuple[Axes, Axes], ticks: list[int], *, legend: bool
) -> None:
    """Both panels' labels, ticks, grid and titles; every axis from 0."""
    devices = results.get("devices", {})
    kind = devices.get("kind", "?")
    if devices.get("logical"):
        kind = f"logical {kind} devices"
    for ax in axes:
        ax.set_xlabel(f"replicas ({kind})")
        if ticks:
            ax.set_xticks(ticks)
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        if legend:
            ax.legend(fontsize="small")
    ax_tp, ax_eff = axes
    ax_tp.set_ylabel("samples/s (median, IQR bars)")
    ax_tp.set_title("Throughput")
    ax_eff.set_ylabel("scaling efficiency (%)")
    ax_eff.set_title("Efficiency: throughput(n) / (n x throughput(1))")
