"""Runtimes for tests: the real `build_runtime`, with the machine's probes replaced."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mgpu_env.config.resolve import ResolvedSettings, resolve_settings
from mgpu_env.config.settings import Settings
from mgpu_env.hardware.nvml import GpuInfo, GpuListing, NvmlSnapshot
from mgpu_env.runtime.decisions import Machine, Runtime, probe_machine
from mgpu_env.runtime.keras import Command, tf_keras_installed
from mgpu_env.runtime.record import decide_runtime

# TensorFlow's devices are fixed by the first test that starts its runtime in a process:
# every in-process test that uses TensorFlow asks for this split first (the session-wide
# `logical_cpus` fixture, or `split_tensorflow()` in a helper).
LOGICAL_CPUS = 4
_SPLIT: list[tuple[str, ...]] = []  # the split's device names, once applied
# A CPU without bf16 instructions, so precision tests do not depend on this machine's CPU.
PLAIN_CPU = frozenset({"avx2", "fma"})


def runtime_of(
    settings: Settings | ResolvedSettings | Mapping[str, str],
    gpus: Sequence[GpuInfo] = (),
    environ: Mapping[str, str] | None = None,
    *,
    nccl: bool = True,
    command: Command = "train",
) -> Runtime:
    """`build_runtime` for these settings (a Settings, resolved settings, or env-var text)
    on a machine whose NVML reports `gpus`."""
    if isinstance(settings, Settings):
        resolved = ResolvedSettings(settings, {}, None, {})
    elif isinstance(settings, ResolvedSettings):
        resolved = settings
    else:
        resolved = resolve_settings(dict(settings), {})
    machine = Machine({} if environ is None else environ, NvmlSnapshot(GpuListing(tuple(gpus))),
                      PLAIN_CPU, tf_keras_installed(), nccl=nccl and bool(gpus))
    return decide_runtime(resolved, machine, command=command)


def runtime_for(gpus: str, environ: Mapping[str, str]) -> Runtime:
    """The runtime `mgpu train` builds for GPUS=`gpus` on the fake NVML installed."""
    resolved = resolve_settings({"GPUS": gpus}, {})
    machine = dataclasses.replace(probe_machine(resolved.settings, environ), cpu_flags=PLAIN_CPU)
    return decide_runtime(resolved, machine, command="train")


def logical_cpu_devices() -> tuple[str, ...]:
    """This process's TensorFlow with the CPU split into LOGICAL_CPUS logical devices (split
    once; later calls return the same names)."""
    if not _SPLIT:
        from mgpu_env.hardware.devices import DeviceSplit, apply_split

        _SPLIT.append(apply_split(DeviceSplit("CPU", 1, LOGICAL_CPUS)))
    return _SPLIT[0]


def logical_cpus_applied() -> bool:
    return bool(_SPLIT)


def split_tensorflow() -> Any:
    """The `tensorflow` module, its devices split first: a helper that runs TensorFlow ops
    in the test process (encoding a PNG starts TensorFlow's devices) calls this, so the
    in-process tests the same worker runs after it can still have their split."""
    logical_cpu_devices()
    import tensorflow as tf

    return tf
