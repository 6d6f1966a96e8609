"""The memory check's child (`training.step.memprobe`) as in-process tests see it: each
dry run and GPU start in the test process would otherwise import TensorFlow in a child for
seconds. `canned_measure` answers the tutorial's MLP with its real sizes (784 -> 64 -> 64
-> 10, Adam) and builds a user's MODEL here, as the dry run once did (those tests take
`logical_cpus`). The tests of the child itself take `real_memory_child`."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_env.estimate.memory import MemoryEstimate
from mgpu_env.training.step import memprobe

REAL_MEASURE = memprobe.measure_in_child
# The MLP's float32 variables: 50,240 + 4,160 + 650 weights; Adam keeps two slots of each.
MLP_BYTES = (784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10) * 4
# Its layers' outputs for one sample: 64, 64, 10 logits, 10 softmax.
MLP_ACTIVATIONS = (64 + 64 + 10 + 10) * 4


def canned_measure(request: memprobe.MemoryRequest, environ: Mapping[str, str]
                   ) -> memprobe.Measured:
    if request.model != "mlp":
        return memprobe.measure_in_process(request)
    batch = request.per_replica_batch
    return memprobe.Measured(MemoryEstimate(batch, MLP_BYTES, 0, MLP_BYTES, 2 * MLP_BYTES,
                                            MLP_ACTIVATIONS * batch))
