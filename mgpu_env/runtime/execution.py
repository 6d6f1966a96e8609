"""`Execution`: what another process needs to start TensorFlow the decided way.

`Execution`: the part of the runtime another process needs to start TensorFlow the decided way
(the environment, the device split, the precision, the strategy plan, the Keras); it travels as
JSON to `mgpu bench`'s children and `mgpu run`'s script."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from mgpu_env.config.errors import RunFailed
from mgpu_env.hardware.devices import DeviceSplit, apply_split
from mgpu_env.runtime.keras import LEGACY_VARIABLE, KerasChoice
from mgpu_env.runtime.precision import PrecisionChoice
from mgpu_env.runtime.strategy import StrategyPlan, WorkerRole

# TensorFlow's C++ INFO and WARNING lines (oneDNN, CPU features) bury the summary; they
# are hidden unless the user set TF_CPP_MIN_LOG_LEVEL.
DEFAULT_TF_LOG_LEVEL = "2"


@dataclass(frozen=True)
class Execution:
    """What a process needs to start TensorFlow as decided: sent to children as JSON."""

    environment: dict[str, str]  # variables to set before TensorFlow is imported
    split: DeviceSplit
    precision: PrecisionChoice
    strategy_plan: StrategyPlan
    keras: KerasChoice  # which Keras tf.keras is; its TF_USE_LEGACY_KERAS is in environment

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Write the environment. Must run before TensorFlow is imported."""
        apply_environment(self.environment, os.environ if environ is None else environ)

    def prepare_tensorflow(self) -> None:
        """Split the devices and set the Keras precision policy (layers read it when built).

        Imports TensorFlow (quietly: `tfprobes.tfimport`); call once per process, before its
        runtime starts (the split is fixed then). Raises RunFailed when TensorFlow sees other
        devices than planned, or when its `tf.keras` is not the Keras decided (TensorFlow
        loaded its Keras before `apply()` wrote TF_USE_LEGACY_KERAS).
        """
        from mgpu_env.runtime.keras import tensorflow_keras_version
        from mgpu_env.runtime.precision import apply_precision
        from mgpu_env.tfprobes.tfimport import import_tensorflow

        import_tensorflow()
        try:
            apply_split(self.split)
        except RuntimeError as err:
            raise RunFailed(f"TensorFlow could not set up the devices: {err}") from None
        loaded = tensorflow_keras_version()
        if loaded != self.keras.version:
            raise RunFailed(
                f"tf.keras is Keras {loaded}, but Keras {self.keras.version} was decided "
                f"({self.keras.reason}): TensorFlow had loaded its Keras before "
                f"{LEGACY_VARIABLE} was set.\n  Fix: call mgpu_env.strategy() before the "
                f"script imports TensorFlow, or set KERAS={loaded}."
            )
        apply_precision(self.precision)

    def make_strategy(self) -> Any:
        """The tf.distribute strategy the plan describes (after `prepare_tensorflow`)."""
        from mgpu_env.runtime.strategy import make_strategy

        return make_strategy(self.strategy_plan)

    def to_json(self) -> str:
        # The plan travels under "strategy", the key `from_json` reads in each child.
        fields = dataclasses.asdict(self)
        fields["strategy"] = fields.pop("strategy_plan")
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> Execution:
        data = json.loads(text)
        split = DeviceSplit(**{**data["split"],
                               "memory_limit_mib": tuple(data["split"]["memory_limit_mib"])})
        plan = data["strategy"]
        role = WorkerRole(**plan.pop("role"))
        strategy_plan = StrategyPlan(**{**plan, "devices": tuple(plan["devices"]), "role": role})
        keras = KerasChoice(**{**data["keras"], "notes": tuple(data["keras"]["notes"])})
        return cls(dict(data["environment"]), split, PrecisionChoice(**data["precision"]),
                   strategy_plan, keras)


def apply_environment(environment: Mapping[str, str], environ: MutableMapping[str, str]) -> None:
    environ.update(environment)
