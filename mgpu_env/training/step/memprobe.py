"""The run's model measured in a child process, before TensorFlow starts in training's.

So its memory is known before TensorFlow starts in the process that trains.

The estimate (`estimate.memory`) needs the built model: its variables, its layers' outputs,
the optimizer's slots. Building it where the run trains would start TensorFlow's devices
there (and, with GPUs, take their memory) before the answer could refuse the batch. So a
child builds it on the CPU (every GPU hidden: `cuda_environment("", uses_gpu=False)`), as
`build_trainer` would, the precision policy set, the optimizer's slots built, and answers
with the estimate's parts as one JSON line (`hardware.childprobe`'s protocol). A user's
MODEL is imported and built there with `user_code.build_model`'s checks: a builder that
fails is the child's answer (its ConfigError's message), raised again here, exit 2.

The child imports TensorFlow: seconds on every start, before the process that trains
imports it again. A built-in model's answer depends only on the request and on the
versions that build it, so `measure` keeps it in the user's cache (`shared.cache`) and later
starts read it there; a user's MODEL is measured every start, as its code (and what it
imports) can change under the same name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import about
from mgpu_env.config.errors import ConfigError
from mgpu_env.estimate.memory import MemoryEstimate
from mgpu_env.hardware import childprobe
from mgpu_env.hardware.devices import cuda_environment
from mgpu_env.runtime.precision import PrecisionChoice
from mgpu_env.training.shared.atomic import atomic_write_text
from mgpu_env.training.shared.cache import user_cache_dir

JSON_MARKER = "MGPU_MEMORY_JSON "
# Importing TensorFlow and building a model: seconds; a cold cache on a slow disk, a minute.
TIMEOUT_S = 300.0
# The models whose estimate is kept between starts: mgpu's own, which change only with
# mgpu's version (in the cache key).
CACHED_MODELS = frozenset({"mlp"})
# Raised when the estimate's parts or their meaning change: older answers are not read.
CACHE_VERSION = 1
# The distributions whose versions build the model and measure it.
BUILT_BY = ("tensorflow", "keras")


@dataclass(frozen=True)
class MemoryRequest:
    """What the child builds: MODEL (`mlp` or the user's builder) for the data's shape, the
    optimizer (Adam at the learning rate), under the run's precision, at its batch."""

    model: str
    seed: int
    input_shape: tuple[int, ...]
    num_classes: int
    per_replica_batch: int
    learning_rate: float
    precision: PrecisionChoice

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MemoryRequest:
        data = json.loads(text)
        return cls(**{**data, "input_shape": tuple(data["input_shape"]),
                      "precision": PrecisionChoice(**data["precision"])})


@dataclass(frozen=True)
class Measured:
    """The child's answer: the estimate, what it assumed (", ..." clauses for the summary),
    and for a user's MODEL the note that it was built (its parameters and outputs)."""

    estimate: MemoryEstimate
    assumed: str = ""
    note: str | None = None

    def to_json(self) -> str:
        return json.dumps({"estimate": self.estimate.as_dict(), "assumed": self.assumed,
                           "note": self.note})

    @classmethod
    def from_json(cls, text: str) -> Measured:
        data = json.loads(text)
        return cls(MemoryEstimate.from_dict(data["estimate"]), str(data["assumed"]),
                   data["note"])


class NotMeasured(Exception):
    """The child gave no estimate (it could not start, crashed, or did not answer in time):
    the reason, for the summary. Not the user's mistake, so the run goes on without it."""


def measure_in_process(request: MemoryRequest) -> Measured:
    """Build the request's model and optimizer here (TensorFlow on the CPU) and estimate.
    Raises ConfigError for a user's builder that fails or does not fit the data."""
    from mgpu_env.estimate import memory
    from mgpu_env.runtime.keras import tensorflow_keras
    from mgpu_env.runtime.precision import apply_precision
    from mgpu_env.tfprobes.tfimport import import_tensorflow
    from mgpu_env.training.step import user_code
    from mgpu_env.training.step.model import build_optimizer, model_builder

    tf = import_tensorflow()
    apply_precision(request.precision)  # layers take the policy when they are built
    tensorflow_keras().utils.set_random_seed(request.seed)
    with tf.device("/CPU:0"):
        model = model_builder(request.model, request.seed, request.input_shape,
                              request.num_classes)()
        optimizer = build_optimizer(request.learning_rate, request.precision.loss_scaling)
        optimizer.build(model.trainable_variables)
    found, assumed = memory.measure(model, optimizer, request.per_replica_batch,
                                    request.precision.policy)
    note = None if request.model == "mlp" else user_code.built_note(
        request.model, model, request.num_classes)
    return Measured(found, assumed, note)


def measure_in_child(request: MemoryRequest, environ: Mapping[str, str],
                     timeout_s: float = TIMEOUT_S) -> Measured:
    """`measure_in_process` in a child Python with `environ`, every GPU hidden from it (and
    no cluster: it builds one model alone). Raises ConfigError (the child's, for a user's
    builder) or NotMeasured (no answer)."""
    env = {k: v for k, v in environ.items() if k != "TF_CONFIG"}
    env.update(cuda_environment("", uses_gpu=False))
    done = childprobe.ask([sys.executable, "-m", __name__, request.to_json()], env,
                          marker=JSON_MARKER, timeout_s=timeout_s)
    why = done.no_answer("the child that builds the model", timeout_s)
    if why is not None or done.answer is None:
        raise NotMeasured(why or "no answer")
    try:
        answer: dict[str, Any] = json.loads(done.answer)
        if "error" in answer:
            raise ConfigError(str(answer["error"]))
        return Measured.from_json(done.answer)
    except (ValueError, KeyError, TypeError) as err:
        raise NotMeasured(f"unreadable answer from the child that builds the model: {err}"
                          ) from None


def cache_file(request: MemoryRequest, environ: Mapping[str, str]) -> Path | None:
    """Where a built-in model's estimate is kept: named by the request and the versions of
    mgpu, TensorFlow and Keras. None for a user's MODEL (measured every start)."""
    if request.model not in CACHED_MODELS:
        return None
    versions = [about.about(environ).mgpu,
                *(about.installed_version(name) for name in BUILT_BY)]
    key = json.dumps([CACHE_VERSION, request.to_json(), versions])
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return user_cache_dir("memory", environ) / f"{name}.json"


def measure(request: MemoryRequest, environ: Mapping[str, str],
            measure_child: Callable[[MemoryRequest, Mapping[str, str]], Measured] | None
            = None) -> Measured:
    """The estimate for `request`: a built-in model's from the cache when an earlier start
    kept it, else from the child (`measure_in_child`), kept for the next start. A cache
    that cannot be read or written is passed by (the child answers)."""
    path = cache_file(request, environ)
    if path is not None:
        try:
            return Measured.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent, or torn by hand: measured again and written anew
    measured = (measure_child or measure_in_child)(request, environ)
    if path is not None:
        # A read-only home: every start measures, as without a cache.
        with contextlib.suppress(OSError):
            atomic_write_text(path, measured.to_json())
    return measured


def main(argv: list[str]) -> None:
    """The child: one request (JSON) in, one marked JSON line out, the estimate or the
    ConfigError's message (anything else escapes: its traceback is the child's stderr)."""
    try:
        answer = measure_in_process(MemoryRequest.from_json(argv[0])).to_json()
    except ConfigError as err:
        answer = json.dumps({"error": str(err)})
    print(JSON_MARKER + answer, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
