"""What a supervised run does after a failure, decided from what was observed: pure.

Three decisions, each from the last attempt's end and the run's devices:

- the stall's phase, read from the stall watch's report on stderr (`stalled_phase`);
- the all-reduce of the next attempt (`all_reduce_after`): a stall in the collectives'
  set-up (the first step) or in the steps, with CROSS_DEVICE_OPS=auto, moves one place down
  NCCL -> hierarchical copy -> reduction to one device, the fixes users of the public hang
  threads converged on (tensorflow#60363, #44976, #22889);
- the GPUs of the next attempt (`keep_devices`): those the health check or the error named
  are left out, and of the rest the most that keep the global batch whole (the feed gives
  replica r of R the rows [b*G + r*G/R, b*G + (r+1)*G/R) of global batch b, so the same
  rows train in the same order whatever R, as long as R divides G). TensorFlow would not
  split an uneven global batch for us either: its rebatching (`RebatchDataset`, under
  `experimental_distribute_dataset`) gives each replica "the current batch size //
  num_replicas". So G=256 on 3 healthy GPUs goes on with 2 (128 each), not with 3.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mgpu_env.training.multiworker.stallhints import FIRST_STEP, PHASES, STEPS

# Stronger first: NCCL, then copies through the host's hierarchy, then one device reduces.
ALL_REDUCE_ORDER = ("nccl", "hierarchical_copy", "reduction_to_one")
# The phases whose stall a collective may cause (the set-up of NCCL's communicators happens
# in the first step; a hang after some steps is tensorflow#22889's).
COLLECTIVE_PHASES = (FIRST_STEP, STEPS)
_STALLED = re.compile(r"the run stalled: no progress for .* in (?P<phase>.+?)(?: \(a call|\.$)")
# A TensorFlow device in an error: /job:localhost/replica:0/task:0/device:GPU:2, GPU:2.
_GPU_NAMED = re.compile(r"device:GPU:(?P<index>\d+)")
_ERROR_WORDS = ("error", "Error", "ERROR", "failed", "lost")


def stalled_phase(lines: Iterable[str]) -> str | None:
    """The phase the stall watch named (`stallhints.PHASES`), or None when it was no stall."""
    found = None
    for line in lines:
        match = _STALLED.search(line)
        if match:
            found = next((p for p in PHASES if match.group("phase").startswith(p)), None)
    return found


def gpu_named(lines: Iterable[str], used: Sequence[int]) -> int | None:
    """The GPU (nvidia-smi index) an error line names by TensorFlow's device name: its
    GPU:k counts the GPUs the run used, in order (CUDA_VISIBLE_DEVICES lists them so)."""
    named = None
    for line in lines:
        if not any(word in line for word in _ERROR_WORDS):
            continue
        for match in _GPU_NAMED.finditer(line):
            k = int(match.group("index"))
            if k < len(used):
                named = used[k]
    return named


def all_reduce_after(requested: str, current: str, phase: str | None,
                     replicas: int) -> str | None:
    """The next all-reduce to try after a stall in `phase`, or None to keep `current`:
    only CROSS_DEVICE_OPS=auto is changed (a value the user set is theirs), only for a stall
    where collectives run (several replicas, `COLLECTIVE_PHASES`), one step down the order."""
    if requested != "auto" or replicas < 2 or phase not in COLLECTIVE_PHASES:
        return None
    if current not in ALL_REDUCE_ORDER or current == ALL_REDUCE_ORDER[-1]:
        return None
    return ALL_REDUCE_ORDER[ALL_REDUCE_ORDER.index(current) + 1]


@dataclass(frozen=True)
class RunDevices:
    """The GPUs a run trains on (nvidia-smi indices, in order), each split into `split`
    replicas (VIRTUAL_DEVICES), and the global batch the run keeps. `setting` is how the
    next attempt is told its devices: GPUS (the list), or VIRTUAL_DEVICES (a count, where
    logical devices stand for the GPUs)."""

    gpus: tuple[int, ...]
    split: int
    global_batch: int
    setting: str = "GPUS"

    @property
    def replicas(self) -> int:
        return len(self.gpus) * self.split

    def environment(self) -> dict[str, str]:
        """The settings that start a run on these devices with this global batch."""
        per_replica = str(self.global_batch // self.replicas)
        if self.setting == "VIRTUAL_DEVICES":
            return {"VIRTUAL_DEVICES": str(self.replicas), "BATCH_SIZE": per_replica}
        return {"GPUS": ",".join(map(str, self.gpus)), "BATCH_SIZE": per_replica}


@dataclass(frozen=True)
class Kept:
    """The devices the next attempt trains on, and those left out (index -> why)."""

    devices: RunDevices
    dropped: Mapping[int, str] = field(default_factory=dict)
    # Healthy GPUs left unused so that the global batch divides; empty when none.
    idle: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stop:
    """No attempt is worth starting: why, and how to go on."""

    message: str


def keep_devices(devices: RunDevices, failing: Mapping[int, str],
                 min_gpus: int) -> Kept | Stop:
    """The GPUs of the next attempt: `devices` without the `failing` ones (index -> why),
    the most of the rest whose replicas divide the global batch, at least `min_gpus`."""
    healthy = [g for g in devices.gpus if g not in failing]
    dropped = {g: why for g, why in failing.items() if g in devices.gpus}
    count = next((n for n in range(len(healthy), 0, -1)
                  if devices.global_batch % (n * devices.split) == 0), 0)
    if count < max(min_gpus, 1):
        left = (f"{len(healthy)} healthy GPU(s) remain"
                + (f", {count} of which keep the global batch {devices.global_batch} whole"
                   if count != len(healthy) else ""))
        why = "; ".join(f"GPU {g}: {reason}" for g, reason in dropped.items())
        return Stop(
            f"not restarting: {left}, fewer than MIN_GPUS={min_gpus} ({why}).\n"
            "  Fix: repair or replace the GPUs left out (`mgpu doctor` says what each "
            "needs), then start the same command again: it resumes from the last checkpoint; "
            "or lower MIN_GPUS.")
    kept = tuple(healthy[:count])
    return Kept(RunDevices(kept, devices.split, devices.global_batch, devices.setting),
                dropped, tuple(healthy[count:]))
