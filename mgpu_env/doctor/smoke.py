"""`mgpu doctor --smoke`: a real, tiny job on the selected devices, in a child process.

Checks only say the pieces are there; this proves they work together, like `accelerate
test`: the runtime training would have (its `Execution`: the device split, the precision,
the strategy with its all-reduce), one all-reduce across every replica checked for the
right sum, one `tf.function(jit_compile=True)` (on a GPU it runs ptxas and reads
libdevice), and one matmul in the precision training chose (the Keras policy's compute
dtype), each timed.

The job runs in a child (`python -m mgpu_env.doctor.smoke '<Execution JSON>'`) with a
timeout, so a hung all-reduce or a crashing driver never hangs or kills the doctor; the
child prints one JSON line. `run` never raises: a failure is a `SmokeResult` with the fix.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import mgpu_env.doctor.links as links
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG
from mgpu_env.doctor.checks.host import FIX_P2P, FIX_P2P_VM
from mgpu_env.hardware import childprobe, signals
from mgpu_env.hardware.hostfacts import P2pHost
from mgpu_env.runtime import Execution, Runtime
from mgpu_env.runtime.strategy import StrategyPlan
from mgpu_env.tfprobes import tflog

JSON_MARKER = "MGPU_SMOKE_JSON "
# TensorFlow's import and the first XLA compilation take most of it; a healthy job is done
# in well under a minute.
DEFAULT_TIMEOUT_S = 180.0
ALL_REDUCE_LENGTH = 1024
MATMUL_SIZE = 256
# Relative error a matmul may show: 16-bit types keep 8 (bf16) or 11 (fp16) mantissa bits.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}

FIX_HANG = (
    "nothing came back within {timeout:g} s: a hung all-reduce is the usual cause (NCCL over "
    "a broken P2P path): run `NCCL_DEBUG=INFO mgpu doctor --smoke` to see where it stops; "
    "try NCCL_P2P_DISABLE=1, or CROSS_DEVICE_OPS=hierarchical_copy"
)
FIX_SETUP = (
    "TensorFlow could not set up the selected devices: see TensorFlow's own reason above "
    "and the driver and CUDA lines of `mgpu doctor`"
)
FIX_ALL_REDUCE = {
    "nccl": "NCCL_DEBUG=INFO mgpu doctor --smoke shows NCCL's reason; see the NCCL and "
    "GPU links lines; CROSS_DEVICE_OPS=hierarchical_copy avoids NCCL",
    "": "see the GPU links line; try another CROSS_DEVICE_OPS (hierarchical_copy, "
    "reduction_to_one)",
}
FIX_XLA_GPU = (
    "XLA could not compile for the GPU: see the ptxas and libdevice lines (`make venv "
    "CUDA=1` or the image install them; XLA_FLAGS=--xla_gpu_cuda_data_dir=... points XLA at "
    "a toolkit); training works without it with XLA=0"
)
FIX_XLA_CPU = "XLA could not compile on the CPU: train with XLA=0"
FIX_MATMUL = "the chosen precision computes wrongly here: see the Mixed precision line; " \
    "MIXED_PRECISION=0 trains in float32"


@dataclass(frozen=True)
class SmokeStep:
    """One part of the job: what it did, how long it took (compilation included)."""

    name: str  # setup, copies, all-reduce, bandwidth, xla, matmul
    ok: bool
    seconds: float
    detail: str
    fix: str = ""
    # bandwidth: (bytes per replica, bus bandwidth in GB/s) at each message size
    values: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SmokeResult:
    """The job's outcome. `error`: the child as a whole failed (timeout, crash)."""

    ok: bool
    steps: tuple[SmokeStep, ...] = ()
    devices: tuple[str, ...] = ()
    device_type: str = ""
    cross_device_ops: str = ""
    policy: str = ""
    seconds: float = 0.0
    error: str | None = None
    fix: str = ""
    # What passed but is off: a bus bandwidth far under the link class's, with its cause.
    warnings: tuple[str, ...] = ()
    hung_in: str = ""  # the phase that made no progress (a copy, the all-reduce, ...)

    @property
    def failures(self) -> list[str]:
        """Each failure's fix, once, in order."""
        fixes = [s.fix for s in self.steps if not s.ok and s.fix]
        if self.fix:
            fixes.append(self.fix)
        return list(dict.fromkeys(fixes))


def failed(error: str, fix: str, seconds: float = 0.0) -> SmokeResult:
    return SmokeResult(ok=False, error=error, fix=fix, seconds=seconds)


# ------------------------------------------------------------------------------- parent


def smoke_test(
    runtime: Runtime | None, environ: Mapping[str, str], timeout_s: float | None = None,
    *, p2p: P2pHost | None = None, phase_timeout_s: float | None = None,
) -> SmokeResult:
    """Run the smoke job in a child with the runtime's environment and decisions, and wait
    at most the timeout (a phase between devices at most `phase_timeout_s` without
    progress); `p2p`: the host's P2P facts, for the likely cause of a hang or a slow link.
    `runtime` None: the settings could not make one. Never raises."""
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    phase_timeout = links.PHASE_TIMEOUT_S if phase_timeout_s is None else phase_timeout_s
    if runtime is None:
        return failed(
            "not run: the settings do not fit this machine",
            "see the lines above marked ERROR (GPUS, mixed precision, all-reduce)",
        )
    env = dict(environ)
    runtime.apply(env)
    # TensorFlow's whole log comes back on the child's stderr; `tflog` keeps its reason.
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    env["MGPU_DEBUG"] = "1"
    done = childprobe.ask(
        [sys.executable, "-m", "mgpu_env.doctor.smoke", runtime.execution.to_json()], env,
        marker=JSON_MARKER, timeout_s=timeout,
        phases=childprobe.PhaseWatch(links.PHASE_MARKER, phase_timeout,
                                     ("copy", "all-reduce", "bandwidth")))
    if done.start_error is not None:
        return failed(done.start_error, FIX_SETUP)
    if done.hung_in is not None:
        return _hung(done, timeout, phase_timeout, p2p)
    reason = tflog.relevant_lines(done.stderr or "")
    if done.answer is not None:
        try:
            result = _with_reason(from_json(done.answer), reason)
            return _judge_bandwidth(result, runtime, p2p)
        except (ValueError, KeyError, TypeError) as err:
            return failed(f"unreadable answer from the smoke job: {err}", FIX_SETUP,
                          done.seconds)
    tail = " | ".join(reason) if reason else done.tail()
    died = signals.describe(done.returncode) if done.returncode is not None else None
    ended = f"was {died}; its last words" if died else f"exited with code {done.returncode}"
    return failed(f"the smoke job {ended}: {tail}", FIX_SETUP, done.seconds)


def _hung(done: childprobe.ChildAnswer, timeout: float, phase_timeout: float,
          p2p: P2pHost | None) -> SmokeResult:
    """The smoke job stopped: past its timeout, or in a phase between devices without
    progress (then with the likely cause the host's P2P facts name)."""
    hung = done.hung_in or "start"
    cause = links.hang_cause(hung, p2p)
    if not cause:
        return failed(f"the smoke job did not finish within {timeout:g} s (stopped)",
                      FIX_HANG.format(timeout=timeout), done.seconds)
    vm = p2p is not None and bool(p2p.hypervisor.value)
    return dataclasses.replace(failed(
        f"the smoke job hung in {hung} (no progress for {phase_timeout:g} s; stopped): "
        f"likely {cause}", FIX_P2P_VM if vm else FIX_P2P, done.seconds,
    ), hung_in=hung)


def _judge_bandwidth(result: SmokeResult, runtime: Runtime, p2p: P2pHost | None
                     ) -> SmokeResult:
    """A bus bandwidth far under the GPUs' link class becomes a warning with its cause."""
    step = next((s for s in result.steps if s.name == "bandwidth" and s.ok), None)
    if step is None or not step.values or result.device_type != "GPU":
        return result
    expected = links.expected_bandwidth(runtime.selection.gpus, runtime.nvml.links)
    if expected is None:
        return result
    warning = links.shortfall(step.values[-1][1], expected, p2p)
    return dataclasses.replace(result, warnings=(warning,)) if warning else result


def _with_reason(result: SmokeResult, reason: tuple[str, ...]) -> SmokeResult:
    """A failed setup step gets TensorFlow's own reason (its relevant log lines)."""
    if not reason:
        return result
    steps = tuple(
        dataclasses.replace(step, detail=f"{step.detail}; TensorFlow says: "
                            + " | ".join(reason))
        if step.name == "setup" and not step.ok else step
        for step in result.steps
    )
    return dataclasses.replace(result, steps=steps)


def to_json(result: SmokeResult) -> str:
    return json.dumps(asdict(result))


def from_json(text: str) -> SmokeResult:
    data = json.loads(text)
    data["steps"] = tuple(
        SmokeStep(**{**step, "values": tuple(tuple(v) for v in step.get("values", ()))})
        for step in data["steps"])
    data["warnings"] = tuple(data.get("warnings", ()))
    data["devices"] = tuple(data["devices"])
    return SmokeResult(**data)


# -------------------------------------------------------------------------------- child


@dataclass
class _Job:
    """The child's running state: what was set up, the steps so far."""

    steps: list[SmokeStep] = field(default_factory=list)

    def step(self, name: str, fix: str, action: Callable[[], tuple[bool, str]]) -> bool:
        start = time.perf_counter()
        try:
            ok, detail = action()
        except Exception as err:
            ok, detail = False, f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
        self.steps.append(SmokeStep(name, ok, round(time.perf_counter() - start, 3), detail,
                                    "" if ok else fix))
        return ok


def run_in_process(execution: Execution) -> SmokeResult:
    """The job itself, in this process (the child). Imports TensorFlow."""
    start = time.perf_counter()
    job = _Job()
    setup: dict[str, Any] = {}
    plan = execution.strategy_plan
    if not job.step("setup", FIX_SETUP, lambda: _set_up(execution, setup)):
        return _result(job, start, setup, execution)
    tf, strategy = setup["tf"], setup["strategy"]
    fix = FIX_ALL_REDUCE.get(plan.cross_device_ops, FIX_ALL_REDUCE[""])
    if plan.local_replicas >= 2:
        job.step("copies", fix, lambda: links.copy_pairs(tf, plan.devices))
    links.phase("all-reduce")
    job.step("all-reduce", fix, lambda: _all_reduce(tf, strategy, plan))
    if plan.local_replicas >= 2:
        _bandwidth(job, fix, tf, strategy, plan)
    links.phase("xla")
    job.step("xla", FIX_XLA_GPU if plan.device_type == "GPU" else FIX_XLA_CPU,
             lambda: _xla(tf, plan.devices[0]))
    links.phase("matmul")
    job.step("matmul", FIX_MATMUL, lambda: _matmul(tf, execution, setup))
    return _result(job, start, setup, execution)


def _set_up(execution: Execution, setup: dict[str, Any]) -> tuple[bool, str]:
    """Start TensorFlow on the execution's devices and build its strategy (kept in `setup`)."""
    import tensorflow as tf

    plan, split = execution.strategy_plan, execution.split
    execution.prepare_tensorflow()  # RunFailed when TensorFlow sees other devices
    setup.update(tf=tf, strategy=execution.make_strategy())
    return True, (
        f"{plan.local_replicas} replica(s) on {split.physical} {split.device_type} "
        f"device(s), {plan.cross_device_ops}: {plan.reason}"
    )


def _all_reduce(tf: Any, strategy: Any, plan: StrategyPlan) -> tuple[bool, str]:
    """One SUM all-reduce of (replica id + 1) on every replica: each must get the total."""

    @tf.function
    def reduce() -> Any:
        def replica_fn() -> Any:
            context = tf.distribute.get_replica_context()
            value = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
            return context.all_reduce(
                tf.distribute.ReduceOp.SUM, value * tf.ones([ALL_REDUCE_LENGTH])
            )

        return strategy.run(replica_fn)

    replicas = plan.local_replicas
    want = replicas * (replicas + 1) / 2
    sums = [float(v.numpy()[0]) for v in strategy.experimental_local_results(reduce())]
    ok = len(sums) == replicas and all(abs(s - want) < 1e-3 for s in sums)
    return ok, (
        f"{replicas} replica(s), {plan.cross_device_ops}: sum {sums[0]:g} on every "
        f"replica (expected {want:g})" if ok else f"sums {sums}, expected {want:g} on each"
    )


def _bandwidth(job: _Job, fix: str, tf: Any, strategy: Any, plan: StrategyPlan) -> None:
    """The bus bandwidth step; when it passes, its step keeps the measured values."""
    measured: dict[str, Any] = {}

    def bandwidth() -> tuple[bool, str]:
        ok, detail, values = links.bandwidth(tf, strategy, plan.local_replicas,
                                             plan.device_type)
        measured["values"] = values
        return ok, detail

    if job.step("bandwidth", fix, bandwidth):
        job.steps[-1] = dataclasses.replace(job.steps[-1], values=measured["values"])


def _xla(tf: Any, device: str) -> tuple[bool, str]:
    """One `jit_compile` function on `device` (on a GPU: ptxas and libdevice), checked."""
    import numpy as np

    points = np.linspace(0.0, 1.0, 4096, dtype=np.float32)
    with tf.device(device):
        compiled = tf.function(
            lambda x: tf.reduce_sum(tf.sin(x) * tf.exp(x)), jit_compile=True
        )
        got = float(compiled(tf.constant(points)))
    want = float(np.sum(np.sin(points) * np.exp(points)))
    ok = abs(got - want) <= 1e-3 * abs(want)
    return ok, f"jit_compile on {_short(device)}: {got:.4f} (expected {want:.4f})"


def _matmul(tf: Any, execution: Execution, setup: dict[str, Any]) -> tuple[bool, str]:
    """One matmul in the compute dtype of training's precision, against float32."""
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()
    choice = execution.precision
    device = execution.strategy_plan.devices[0]
    setup["policy"] = choice.policy
    dtype = keras.mixed_precision.Policy(choice.policy).compute_dtype
    with tf.device(device):
        a = tf.random.stateless_uniform([MATMUL_SIZE, MATMUL_SIZE], seed=[1, 2])
        b = tf.random.stateless_uniform([MATMUL_SIZE, MATMUL_SIZE], seed=[3, 4])
        got = tf.cast(tf.matmul(tf.cast(a, dtype), tf.cast(b, dtype)), tf.float32)
        want = tf.matmul(a, b)
        error = float(tf.reduce_max(tf.abs(got - want)) / tf.reduce_max(tf.abs(want)))
    ok = error <= TOLERANCE.get(dtype, 1e-2)
    return ok, (
        f"{MATMUL_SIZE}x{MATMUL_SIZE} in {dtype} ({choice.policy}): relative error "
        f"{error:.1e} (at most {TOLERANCE.get(dtype, 1e-2):g})"
    )


def _short(device: str) -> str:
    return device.rsplit("/device:", 1)[-1]  # /job:localhost/.../device:CPU:1 -> CPU:1


def _result(
    job: _Job, start: float, setup: Mapping[str, Any], execution: Execution
) -> SmokeResult:
    plan = execution.strategy_plan
    return SmokeResult(
        ok=bool(job.steps) and all(s.ok for s in job.steps)
        and job.steps[-1].name == "matmul",
        steps=tuple(job.steps),
        devices=tuple(_short(d) for d in plan.devices),
        device_type=plan.device_type,
        cross_device_ops=plan.cross_device_ops,
        policy=str(setup.get("policy", "")),
        seconds=round(time.perf_counter() - start, 3),
    )


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m mgpu_env.doctor.smoke '<Execution JSON>'", file=sys.stderr)
        sys.exit(EXIT_BAD_CONFIG)
    print(JSON_MARKER + to_json(run_in_process(Execution.from_json(sys.argv[1]))), flush=True)


if __name__ == "__main__":
    main()
