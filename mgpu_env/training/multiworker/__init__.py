"""Multi-worker runs: the cluster, the workers' agreement, and stopping when a worker dies.

`mgpu train` runs on several machines with TensorFlow's own collective engine,
`tf.distribute.MultiWorkerMirroredStrategy`, configured by `TF_CONFIG` (what Kubernetes'
TFJob operator and other launchers set) or by `WORKER_HOSTS` + `WORKER_INDEX`, which build
it. Training itself is the same custom step as on one machine (see
`mgpu_env.training.step.steps` for why it is not `model.fit`); this module adds what only a
cluster needs:

- The cluster itself is decided by the runtime (`mgpu_env.runtime.cluster`: TF_CONFIG,
  WORKER_HOSTS, Slurm or a Kubernetes Indexed Job), which exports the TF_CONFIG TensorFlow
  reads before TensorFlow starts; this package receives it.
- `check_agreement` all-gathers the settings that must match on every worker (batch size,
  precision, data set, epochs, ...) and names the first one that differs, before training.
- `broadcast_from_chief` gives every worker the chief's restored checkpoint, so workers
  need no shared folder: the chief's OUTPUT_DIR is the one source of truth, and the others
  write their share of each (collective) checkpoint save to a scratch folder they delete.
- Faults. When a worker process dies, TensorFlow's coordination service (which
  MultiWorkerMirroredStrategy starts) misses its heartbeats and aborts the collectives
  on the others within about 10 s (a reset connection is noticed at once); the step then
  raises, and `explain_worker_failure` turns that into one clear line. Two hangs remain
  that TensorFlow does not bound: a worker that never joins (the others wait in the
  strategy's constructor, where even SIGTERM is swallowed), and a worker alive but stuck
  (its heartbeats continue). `Watchdog` bounds both: when no progress is reported for
  WORKER_TIMEOUT seconds it prints why and ends the process, the one place the library
  exits, because a thread blocked inside a C++ collective cannot be interrupted.

Nothing here imports TensorFlow at module level.
"""

from mgpu_env.training.multiworker.agreement import (
    VALUE_WIDTH,
    agreement_values,
    broadcast_from_chief,
    check_agreement,
    decode_values,
    encode_values,
    find_disagreements,
)
from mgpu_env.training.multiworker.faults import (
    BACKSTOP_GRACE_S,
    EXIT_WORKER_LOST,
    Watchdog,
    abort_process,
    explain_worker_failure,
    is_worker_failure,
    lost_tasks,
    reclaim_signal_handlers,
)
from mgpu_env.training.multiworker.scratch import remove_scratch_dir, scratch_dir
from mgpu_env.training.multiworker.session import WorkerSession

__all__ = [
    "BACKSTOP_GRACE_S",
    "EXIT_WORKER_LOST",
    "VALUE_WIDTH",
    "Watchdog",
    "WorkerSession",
    "abort_process",
    "agreement_values",
    "broadcast_from_chief",
    "check_agreement",
    "decode_values",
    "encode_values",
    "explain_worker_failure",
    "find_disagreements",
    "is_worker_failure",
    "lost_tasks",
    "reclaim_signal_handlers",
    "remove_scratch_dir",
    "scratch_dir",
]
