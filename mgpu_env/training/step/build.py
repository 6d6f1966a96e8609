"""Model, optimizer and step functions built under a strategy.

Shared by `mgpu train` and each `mgpu bench` point, so the benchmark measures exactly the step
that trains."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mgpu_env.training.step.loops import StepLoops
from mgpu_env.training.step.steps import StepFunctions, StepSpec, make_step_functions


@dataclass
class Trainer:
    """What the training loop drives: the model and optimizer, mirrored, the steps, and the
    compiled loops that run them over any feed's source (`loops.runner(feed.source(at))`)."""

    strategy: Any
    model: Any
    optimizer: Any
    steps: StepFunctions
    loops: StepLoops = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.loops = StepLoops(self.strategy, self.steps)


def build_trainer(
    strategy: Any,
    build_model: Callable[[], Any],
    spec: StepSpec,
    *,
    prepare_input: Callable[[Any], Any] | None = None,
) -> Trainer:
    """Build the model and optimizer in the strategy's scope, and the step functions.

    The Keras precision policy must already be set (`Execution.start`), since layers take
    it when they are built.
    """
    from mgpu_env.training.step.model import build_optimizer

    with strategy.scope():
        model = build_model()
        optimizer = build_optimizer(spec.learning_rate, spec.loss_scaling)
        # Build the optimizer's slots now, so a checkpoint restores into all of them.
        optimizer.build(model.trainable_variables)
    steps = make_step_functions(strategy, model, optimizer, spec, prepare_input=prepare_input)
    return Trainer(strategy, model, optimizer, steps)
