"""The chain's records: a `Layer` with the GPUs that pass it, a `Drop` with its account."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mgpu_env.doctor.facts import Facts

# The bus ids (sysfs form) that passed the layers so far; None: no layer below could count.
Passing = tuple[str, ...] | None


@dataclass(frozen=True)
class Drop:
    """GPUs that passed the layer below and not this one. `known`: the cause comes from this
    layer's facts (else the cause is "dropped between X and Y; facts: ..."). `intended`: the
    job was not given them, or GPUS left them out: no fault."""

    gpus: tuple[str, ...]  # bus ids, or "GPU <n>" where the layer only counts
    cause: str
    fix: str = ""
    known: bool = True
    intended: bool = False


@dataclass(frozen=True)
class Layer:
    """One layer: the GPUs that pass it (None: it only counts, or could not be read),
    how many (None: not read here), the facts it was judged from and its drops."""

    name: str
    gpus: Passing
    count: int | None
    facts: tuple[str, ...] = ()
    drops: tuple[Drop, ...] = ()

    @property
    def read(self) -> bool:
        return self.count is not None


@dataclass(frozen=True)
class Chain:
    layers: tuple[Layer, ...]
    warnings: tuple[str, ...] = ()

    @property
    def faults(self) -> tuple[tuple[Layer, Drop], ...]:
        """The drops nobody asked for, with their layer, bottom up."""
        return tuple((layer, drop) for layer in self.layers for drop in layer.drops
                     if not drop.intended)

    def counts(self) -> str:
        """`PCI bus 4 -> kernel driver 4 -> ... -> TensorFlow 4` (layers not read left out)."""
        return " -> ".join(f"{layer.name} {layer.count}" for layer in self.layers if layer.read)

    def unread(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers if not layer.read)

    def layer(self, name: str) -> Layer | None:
        return next((layer for layer in self.layers if layer.name == name), None)


Step = Callable[[Facts, Passing], Layer]


def unknown(name: str, why: str) -> Layer:
    """A layer not read here: it passes what came from below."""
    return Layer(name, None, None, (why,))


def between(lower: str, upper: str, gpus: tuple[str, ...], facts: tuple[str, ...]) -> Drop:
    """A drop no fact of the layer explains, said as such."""
    said = "; ".join(facts) or "none read"
    return Drop(gpus, f"dropped between {lower} and {upper}; facts: {said}",
                "run `mgpu doctor --report` and attach it to an issue: no known cause fits",
                known=False)
