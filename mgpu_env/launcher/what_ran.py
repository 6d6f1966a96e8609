"""The lines after the script: what ran (observed by `run_observer`), against the plan.

    lines = what_ran(Seen(observed(), built_strategies(), listed_devices()),
                     Planned(replicas, precision, device_type), failed=False)

Pure functions of the records, so every case is a unit test:
- the strategy whose steps ran (`fit`, `strategy.run`), with the devices and replicas it
  really had: devices it names that TensorFlow does not list are said, since TensorFlow then
  places their ops elsewhere (soft placement) and "2 replicas" is not 2 devices; strategies
  built but never stepped are counted, never reported as the one that ran;
- TensorFlow's default strategy when Keras stepped outside every scope, or a loop that
  stepped outside every strategy (a `tape.gradient` or Keras layers, no `strategy.run`);
- a DTensor mesh the script laid its tensors on, with its own devices;
- the precision the Keras layers computed in (and which call of the script's decided it:
  `set_global_policy`, or `clear_session`, which in Keras 3 resets the global policy), or, with
  no Keras layer, the dtypes the step's gradient was taken in: the policy only reaches layers.

A script that failed before any step gets none of these lines: no advice about code that
never ran. A plan that differs from what ran is a `warning:` with the cause and the fix.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mgpu_env.launcher.run_observer import Observed, PolicyChange, Use
from mgpu_env.launcher.strategy_watch import BuiltStrategy, PlannedReplicas, strategy_problem
from mgpu_env.runtime.precision import MIXED_FLOAT16

if TYPE_CHECKING:
    from mgpu_env.launcher.source_scan import ScriptScan
    from mgpu_env.runtime import Runtime

PREFIX = "mgpu run: "


@dataclass(frozen=True)
class PlannedPrecision:
    """The policy mgpu set before the script, and the setting that chose it."""

    policy: str  # float32, mixed_float16, mixed_bfloat16
    reason: str  # "MIXED_PRECISION=bf16"

    @property
    def compute(self) -> str:
        return {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}.get(
            self.policy, self.policy)


@dataclass(frozen=True)
class Seen:
    """What TensorFlow shows after the script: the records observed while it ran, the
    strategies it built, and the short names of the devices TensorFlow lists now."""

    observed: Observed
    built: tuple[BuiltStrategy, ...]
    existing: tuple[str, ...]


@dataclass(frozen=True)
class Planned:
    """What mgpu planned for the script: the replicas, the precision and the device type."""

    replicas: PlannedReplicas
    precision: PlannedPrecision
    device_type: str


def _count(number: int, word: str) -> str:
    return f"{number} {word}" if number == 1 else f"{number} {word}s"


def _at(where: str) -> str:
    return f" at {where}" if where else ""


def _devices(devices: tuple[str, ...]) -> str:
    shown = devices if len(devices) <= 4 else (*devices[:2], "...", devices[-1])
    return ", ".join(shown)


def strategy_lines(observed: Observed, built: tuple[BuiltStrategy, ...],
                   planned: PlannedReplicas, existing: tuple[str, ...],
                   *, quiet: bool = False) -> list[str]:
    """The strategies whose steps ran (or why none did), one line each."""
    stepped = [use for use in observed.uses if use.step]
    ran = {use.strategy for use in stepped if use.strategy is not None}
    unused = [b for b in dict.fromkeys(built) if b not in ran]
    idle = (f"; the script also built {_unused(unused)}, and no step ran under "
            f"{'it' if len(unused) == 1 else 'them'}") if unused else ""
    lines = []
    for use in stepped:
        if use.strategy is None:
            continue
        problem = strategy_problem(use.strategy, planned, existing)
        if problem is None and quiet:
            continue
        lines.append(f"{PREFIX}strategy that ran: {use.strategy.describe()}: {use.how}"
                     f"{_at(use.where)}{idle}; "
                     + (problem if problem is not None else f"as planned ({planned.by})"))
        idle = ""
    default = next((use for use in stepped if use.strategy is None), None)
    if default is not None:
        lines.extend(_outside(f"TensorFlow's default strategy (one device, 1 replica): "
                              f"{default.how}{_at(default.where)}", unused, planned, quiet))
    elif not stepped and observed.computed() and not (observed.gradient and
                                                      observed.gradient.mesh):
        where = observed.gradient.where if observed.gradient else ""
        lines.extend(_outside(f"none: the steps{_at(where)} ran outside every strategy, "
                              "on one device", unused, planned, quiet))
    elif not observed.computed() and unused and not quiet:
        lines.append(f"{PREFIX}no step ran: the script built {_unused(unused)} and ran "
                     "nothing under it")
    return lines


def _unused(unused: list[BuiltStrategy]) -> str:
    return ", ".join(f"{b.kind} ({_count(b.replicas, 'replica')})" for b in unused)


def _outside(what: str, unused: list[BuiltStrategy], planned: PlannedReplicas,
             quiet: bool) -> list[str]:
    if planned.replicas == 1:
        return [] if quiet else [f"{PREFIX}strategy that ran: {what}; as planned ({planned.by})"]
    if unused:
        fix = (f"build and compile the model inside `with strategy.scope():` of the "
               f"{unused[0].kind} the script built ({unused[0].describe()}), and run the steps "
               "with it (model.fit, or strategy.run in a custom loop)")
    else:
        fix = ("build tf.distribute.MirroredStrategy() (or mgpu_env.strategy()), the model in "
               "its scope(), and train with model.fit or strategy.run")
    return [f"{PREFIX}strategy that ran: {what}; {planned.by}. Fix: {fix}"]


def mesh_lines(observed: Observed, planned: PlannedReplicas, device_type: str,
               *, quiet: bool = False) -> list[str]:
    """The DTensor meshes the script laid its tensors on (and the step's, if it ran there)."""
    lines = []
    gradient = observed.gradient
    for mesh in observed.meshes:
        stepped = gradient is not None and gradient.mesh == mesh.dims
        said = (f"{PREFIX}mesh {'that ran' if stepped else 'used'}: DTensor mesh {mesh.dims}"
                f" on {_count(len(mesh.devices), 'device')} ({_devices(mesh.devices)}), laid "
                f"out{_at(mesh.where)}" + (f", its step's gradient{_at(gradient.where)}"
                                          if stepped and gradient else ""))
        if len(mesh.devices) == planned.replicas:
            if not quiet:
                lines.append(f"{said}; as planned ({planned.by})")
            continue
        own = _count(len(mesh.devices), f"{device_type} device")
        lines.append(
            f"{said}; {planned.by}: the script set up its own {own}. Fix: to make the plan "
            f"what runs, VIRTUAL_DEVICES={len(mesh.devices)} (and drop the script's own "
            "device split), or build the mesh on the planned devices")
    return lines


def precision_lines(observed: Observed, planned: PlannedPrecision,
                    *, quiet: bool = False) -> list[str]:
    """The dtypes Keras layers computed in, or, with no Keras layer, the step's."""
    if not observed.layers:
        return _no_layers(observed, planned, quiet)
    groups = sorted(observed.layers.items(), key=lambda item: -item[1])
    parts: list[str] = []
    notes: list[str] = []
    for (compute, policy), number in groups:
        extra = [] if policy == compute else [policy]
        if policy != planned.policy:
            change = _decided_by(observed.policy_changes, policy)
            if change is not None:
                notes.append(_policy_note(change, compute, number, planned))
            else:  # no call of the script's made it global: the layers' own dtype=
                first = observed.first_layer[(compute, policy)]
                extra.append(f"its own dtype: {first}" + (" and more" if number > 1 else ""))
        parts.append(f"{_count(number, 'Keras layer')} in {compute}"
                     + (f" ({', '.join(extra)})" if extra else ""))
    everything = ", ".join(parts)
    lines = [] if quiet and not notes else [
        f"{PREFIX}precision that ran: {everything}"
        + (f"; as planned ({planned.reason})" if not notes else "")]
    return lines + notes


def _decided_by(changes: list[PolicyChange], policy: str) -> PolicyChange | None:
    """The last call of the script's that made the global policy `policy`."""
    return next((c for c in reversed(changes) if c.after == policy), None)


def _policy_note(change: PolicyChange, compute: str, number: int,
                 planned: PlannedPrecision) -> str:
    layers = f"the {_count(number, 'Keras layer')} built after it computed in {compute}"
    not_planned = f"not {planned.compute}, which {planned.reason} planned"
    if change.call.startswith("clear_session"):
        return (
            f"{PREFIX}warning: {change.call}{_at(change.where)} reset {change.keras}'s global "
            f"precision policy, to {change.after}, so {layers}, {not_planned}. Fix: set the "
            f"policy again after it: keras.mixed_precision.set_global_policy("
            f"'{planned.policy}')")
    return (f"{PREFIX}note: the script set its own precision policy ({change.keras} "
            f"{change.call}{_at(change.where)}): {layers} ({change.after}), {not_planned}")


def _no_layers(observed: Observed, planned: PlannedPrecision, quiet: bool) -> list[str]:
    gradient = observed.gradient
    if gradient is None:
        return []
    loss = "/".join(dict.fromkeys(gradient.target_dtypes)) or "?"
    variables = ", ".join(f"{_count(gradient.source_dtypes.count(d), 'variable')} {d}"
                          for d in dict.fromkeys(gradient.source_dtypes))
    said = (f"no Keras layer computed; the step's gradient{_at(gradient.where)} was taken of "
            f"a {loss} loss for {variables or 'no variable'}")
    if planned.compute in {loss, *gradient.source_dtypes} or planned.policy == "float32":
        return [] if quiet else [f"{PREFIX}precision that ran: {said}; as planned "
                                 f"({planned.reason})"]
    return [f"{PREFIX}warning: precision that ran: {said}, not {planned.compute}: "
            f"{planned.reason} set Keras' policy {planned.policy}, and only Keras layers "
            f"take it. Fix: compute in {planned.compute} yourself (tf.cast the inputs and "
            f"variables to tf.{planned.compute}), or build the model of Keras layers"]


def what_ran(seen: Seen, plan: Planned, *, failed: bool, quiet: bool = False) -> list[str]:
    """Every line after the script. `failed`: the script raised or exited non-zero. Nothing
    when it failed before any step, and nothing for a script that never imported TensorFlow
    (no records)."""
    observed, built, existing = seen.observed, seen.built, seen.existing
    planned, precision, device_type = plan.replicas, plan.precision, plan.device_type
    if not observed.computed():  # no step: no precision that computed, and after a failure
        return [] if failed else [  # no advice about code that never ran
            *strategy_lines(observed, built, planned, existing, quiet=quiet),
            *mesh_lines(observed, planned, device_type, quiet=quiet)]
    return [*strategy_lines(observed, built, planned, existing, quiet=quiet),
            *mesh_lines(observed, planned, device_type, quiet=quiet),
            *precision_lines(observed, precision, quiet=quiet)]


def ran_notes(runtime: Runtime, scan: ScriptScan | None, *, failed: bool) -> list[str]:
    """What ran, as observed (`launcher/what_ran.py`): nothing for a script that never
    imported TensorFlow, or that failed before any step."""
    if "tensorflow" not in sys.modules:
        return []
    from mgpu_env.launcher.run_observer import observed
    from mgpu_env.launcher.strategy_watch import built_strategies, listed_devices, planned_replicas

    replicas = planned_replicas(runtime.strategy_plan, runtime.replicas,
                                runtime.role.num_workers)
    precision = PlannedPrecision(runtime.precision.policy, runtime.precision.reason)
    seen = observed()
    lines = what_ran(Seen(seen, built_strategies(), listed_devices()),
                     Planned(replicas, precision, runtime.device_type),
                     failed=failed, quiet=runtime.settings.quiet)
    fp16 = any(policy == MIXED_FLOAT16 for _, policy in seen.layers)
    if fp16 and precision.policy != MIXED_FLOAT16 and scan is not None and (
            loop := scan.unscaled_custom_loop()) is not None:
        lines.append("  warning: " + unscaled_loop_warning(loop.where, "The script's policy"))
    return lines


def unscaled_loop_warning(where: str, whose: str) -> str:
    """A custom loop that applies float16 gradients without loss scaling, and the fix."""
    return (
        f"{whose} gives mixed_float16, and {where} calls apply_gradients with no "
        "LossScaleOptimizer in the script: small float16 gradients flush to zero without "
        "loss scaling. Fix: optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)"
        " and scale the loss (Keras 3: loss = optimizer.scale_loss(loss); Keras 2: "
        "get_scaled_loss and get_unscaled_gradients), or MIXED_PRECISION=bf16 (no scaling "
        "needed)"
    )


__all__ = ["PlannedPrecision", "Use", "mesh_lines", "precision_lines", "ran_notes",
           "strategy_lines", "unscaled_loop_warning", "what_ran"]
