"""The chain from the PCI bus to TensorFlow, counted layer by layer.

The chain from the PCI bus to TensorFlow, counted: every GPU at every layer, every drop with
its account.

    PCI bus -> kernel driver -> nvidia module -> device files -> user-space driver -> NVML
            -> this job (Slurm, Kubernetes, the container, CUDA_VISIBLE_DEVICES) -> GPUS
            -> CUDA -> TensorFlow

Each layer holds the GPUs that pass it (by PCI bus id, up to the GPUS layer; CUDA and
TensorFlow only count) and the facts it was judged from. A layer passes only GPUs that passed
the one below, so the counts can only fall; each GPU that falls is a `Drop` with the cause
that layer's facts give, or "dropped between X and Y; facts: ..." when they give none.
A drop the job asked for (GPUs given to another job, GPUs GPUS left out) is `intended`;
every other one is a fault. A layer whose facts could not be read here passes what came up
from below and says so: it is not counted, never guessed.

Pure: `build(facts)` reads only `Facts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mgpu_env.doctor import chainlower, chainupper
from mgpu_env.doctor.chaintypes import Chain, Drop, Layer, Passing
from mgpu_env.doctor.facts import Facts

__all__ = ["Chain", "Drop", "Layer", "Passing", "build"]


@dataclass
class _Walk:
    """The GPUs still passing while the layers are built, bottom up."""

    passing: Passing = None
    layers: list[Layer] = field(default_factory=list)

    def add(self, layer: Layer) -> None:
        self.layers.append(layer)
        if layer.gpus is not None:
            self.passing = layer.gpus


def build(facts: Facts) -> Chain:
    """The chain as this machine and job show it."""
    walk = _Walk()
    for step in (*chainlower.LAYERS, *chainupper.LAYERS):
        walk.add(step(facts, walk.passing))
    return Chain(tuple(walk.layers), tuple(_extra_warnings(facts)))


def _extra_warnings(facts: Facts) -> Iterable[str]:
    yield from chainupper.warnings(facts)
