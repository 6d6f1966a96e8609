"""The strategies a script builds, and the plan each is held against at its first step.

`mgpu run`'s start summary says what the settings planned (`planned 2 x logical CPU, 2
replica(s)`); a script that builds `MultiWorkerMirroredStrategy()` in one process, or names
its devices (`MirroredStrategy(['/device:GPU:0'])`), trains on fewer, or on devices that do
not exist. After TensorFlow is imported `watch` wraps the one constructor every TF 2
strategy runs, `StrategyBase.__init__` (MirroredStrategy, MultiWorkerMirroredStrategy,
OneDeviceStrategy, TPU and parameter-server strategies all call it with their `extended`,
already holding the devices): a wrapper over `__init__` changes nothing the strategy does,
where one over `scope()` would run on every `with`. Each strategy built is recorded (class,
devices, `num_replicas_in_sync`) and said on stderr, without advice: a strategy built is not
one that ran (a script may build four and train under the first). `run_observer` sees the
first step under each and calls `first_step`, which warns, before that step runs, where the
strategy differs from the plan (`strategy_problem`: devices TensorFlow does not list, then
the replicas); `what_ran` says what ran after the script. TensorFlow's own default strategy
(no `scope()` at all) is a `StrategyV1` and is never recorded as built.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from mgpu_env.launcher.run_watch import strategy_built
from mgpu_env.runtime.strategy import StrategyPlan

# One process holds one run: the strategies it built, in order, and its plan.
_BUILT: list[BuiltStrategy] = []
_PLANNED: list[PlannedReplicas] = []
# TensorFlow's public names for classes it exports under another (tf.distribute.
# MultiWorkerMirroredStrategy is collective_all_reduce_strategy.CollectiveAllReduceStrategy).
PUBLIC_NAMES = {"CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}
# TensorFlow's own strategy outside every scope(): never the script's.
DEFAULT_STRATEGY = "_DefaultDistributionStrategy"


def _count(number: int, word: str) -> str:
    return f"{number} {word}" if number == 1 else f"{number} {word}s"


@dataclass(frozen=True)
class BuiltStrategy:
    """A strategy the script built: its class, devices and replicas in sync."""

    kind: str  # the class name: MirroredStrategy
    devices: tuple[str, ...]  # short device names: CPU:0, GPU:1
    replicas: int  # num_replicas_in_sync (every worker's, between workers)
    # MirroredStrategy() without devices, given the plan's by `mgpu run` (False: the script
    # named its devices, or another class).
    planned_devices: bool = False

    def describe(self) -> str:
        devices = f"{_count(len(self.devices), 'device')} ({', '.join(self.devices)})" \
            if self.devices else "its devices"
        return f"{self.kind} on {devices}, {_count(self.replicas, 'replica')} in sync"


@dataclass(frozen=True)
class PlannedReplicas:
    """What the settings planned, in the words of the setting that decided it."""

    replicas: int  # every worker's
    by: str  # "GPUS selected 2", "VIRTUAL_DEVICES planned 2", "2 workers x 1 planned 2"
    multi_worker: bool


def planned_replicas(plan: StrategyPlan, replicas: int, workers: int) -> PlannedReplicas:
    """The plan's replicas and the setting that chose them: `replicas` is the run's total
    (`Runtime.replicas`), `workers` the cluster's size (1 for one process)."""
    if workers > 1:
        by = f"{workers} workers x {plan.local_replicas} device(s) planned {replicas}"
    elif plan.logical_split:
        by = f"VIRTUAL_DEVICES planned {replicas}"
    elif plan.device_type == "GPU":
        by = f"GPUS selected {replicas}"
    else:
        by = f"the plan has {replicas}"
    return PlannedReplicas(replicas, by, plan.kind == "multi_worker")


def mismatch(built: BuiltStrategy, planned: PlannedReplicas) -> str | None:
    """The difference between what the script built and the plan, and the fix where there
    is one; None when the replicas agree."""
    if built.replicas == planned.replicas:
        return None
    line = (f"the script's {built.kind} uses "
            f"{_count(len(built.devices) or built.replicas, 'device')} "
            f"({_count(built.replicas, 'replica')} in sync); {planned.by}")
    if built.replicas > planned.replicas:
        return line
    if built.kind == "MultiWorkerMirroredStrategy" and not planned.multi_worker:
        fix = ("MultiWorkerMirroredStrategy in one process mirrors one CPU (or this "
               "machine's GPUs): use tf.distribute.MirroredStrategy() (or "
               "mgpu_env.strategy()), which takes the planned devices")
    elif built.kind == "MirroredStrategy" and planned.multi_worker:
        fix = ("MirroredStrategy mirrors one worker's devices: use "
               "tf.distribute.MultiWorkerMirroredStrategy() (or mgpu_env.strategy())")
    elif built.kind == "MirroredStrategy" and built.planned_devices:
        return (f"{line}: the script set up {_count(len(built.devices), 'device')} itself "
                "before it built the strategy, and MirroredStrategy() took those")
    elif built.kind == "MirroredStrategy":
        fix = ("drop its devices argument: tf.distribute.MirroredStrategy() takes the "
               "planned devices")
    else:
        fix = "use tf.distribute.MirroredStrategy() (or mgpu_env.strategy())"
    return f"{line}. Fix: {fix}"


def missing_devices(built: BuiltStrategy, existing: tuple[str, ...]) -> tuple[str, ...]:
    """The devices a strategy names that TensorFlow does not list (`existing`, short names;
    empty: not known)."""
    if not existing:
        return ()
    return tuple(device for device in built.devices if device not in existing)


def strategy_problem(built: BuiltStrategy, planned: PlannedReplicas,
                     existing: tuple[str, ...]) -> str | None:
    """What differs between a strategy and the plan, with the fix; None when nothing does.
    Devices that do not exist come first: TensorFlow builds a strategy on them anyway, and
    soft placement puts their replicas' ops elsewhere, so the replica count is no check."""
    missing = missing_devices(built, existing)
    if missing:
        shown = ", ".join(existing)
        return (
            f"the script's {built.kind} names {', '.join(missing)}, which TensorFlow does not "
            f"list here (it lists {shown}): its {_count(built.replicas, 'replica')} run where "
            f"soft device placement puts their ops, not on {_count(built.replicas, 'device')} "
            f"of their own. Fix: drop its devices argument (tf.distribute.MirroredStrategy() "
            "takes the planned devices), or name devices TensorFlow lists")
    return mismatch(built, planned)


def listed_devices() -> tuple[str, ...]:
    """The short names of the devices TensorFlow lists (CPU:0, GPU:1), once its runtime has
    started; () before, since listing them would start it and fix the device split before a
    script that splits the devices itself has done so."""
    from tensorflow.python.eager import context

    if not getattr(context.context(), "_initialized", False):
        return ()
    import tensorflow as tf

    return tuple(str(device.name).rsplit("device:", 1)[-1]
                 for device in tf.config.list_logical_devices())


def describe_strategy(strategy: Any) -> BuiltStrategy:
    """Class, devices and replicas of a built tf.distribute strategy."""
    try:
        devices = tuple(str(name).rsplit("device:", 1)[-1]
                        for name in strategy.extended.worker_devices)
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        devices = ()
    name = type(strategy).__name__
    return BuiltStrategy(PUBLIC_NAMES.get(name, name), devices,
                         int(strategy.num_replicas_in_sync),
                         bool(getattr(strategy, "_mgpu_planned_devices", False)))


def watch(planned: PlannedReplicas, *, quiet: bool = False) -> None:
    """Record (and say on stderr) every TF 2 strategy built from now on in this process
    (`quiet`, QUIET=1: record only). Imports TensorFlow; a second call only changes the
    plan compared against."""
    from tensorflow.python.distribute import distribute_lib

    _PLANNED[:] = [planned]
    base: Any = distribute_lib.StrategyBase
    original = getattr(base.__init__, "_mgpu_original", base.__init__)

    def __init__(self: Any, extended: Any) -> None:
        original(self, extended)
        strategy_built()
        if isinstance(self, distribute_lib.Strategy) and type(self).__name__ != DEFAULT_STRATEGY:
            _record(self, planned, quiet)

    __init__._mgpu_original = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    base.__init__ = __init__


def _record(strategy: Any, planned: PlannedReplicas, quiet: bool) -> None:
    try:
        built = describe_strategy(strategy)
    except Exception:  # a strategy this cannot read: the script's run is what matters
        return
    said = {*_BUILT}  # a script that builds the same strategy 9 times is told once
    _BUILT.append(built)
    if built in said or quiet:
        return
    # Built is not run (a script may build four and train under the first): the plan is
    # held against a strategy at its first step (`first_step`), and after the script.
    differs = "" if built.replicas == planned.replicas else f" ({planned.by})"
    print(f"mgpu run: strategy built: {built.describe()}{differs}", file=sys.stderr,
          flush=True)


def first_step(built: BuiltStrategy | None, how: str, where: str) -> None:
    """Said on stderr when a strategy's first step starts (`run_observer`), before it runs:
    a warning where it differs from the plan (`built` None: TensorFlow's default strategy,
    outside every scope). The fix follows after the script."""
    planned = _PLANNED[-1] if _PLANNED else None
    if planned is None:
        return
    at = f" at {where}" if where else ""
    if built is None:
        if planned.replicas > 1:
            print(f"mgpu run: warning: {how}{at} runs on TensorFlow's default strategy "
                  f"(one device, 1 replica), outside the scope of any strategy the script "
                  f"built; {planned.by}", file=sys.stderr, flush=True)
        return
    if (problem := strategy_problem(built, planned, listed_devices())) is not None:
        print(f"mgpu run: warning: {how}{at} runs under {built.kind}: {problem}",
              file=sys.stderr, flush=True)


def built_strategies() -> tuple[BuiltStrategy, ...]:
    """The strategies built in this process since `watch`, in order."""
    return tuple(_BUILT)


def _reset() -> None:
    """Forget the strategies built and the plan (tests)."""
    _BUILT.clear()
    _PLANNED.clear()


__all__ = ["BuiltStrategy", "PlannedReplicas", "built_strategies", "describe_strategy",
           "first_step", "listed_devices", "mismatch", "missing_devices", "planned_replicas",
           "strategy_problem", "watch"]
