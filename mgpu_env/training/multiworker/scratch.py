"""A non-chief worker's scratch folder for its share of the (collective) checkpoints."""

from __future__ import annotations

from mgpu_env.runtime.cluster.scratch import OwnedFolder, owned_folder, sweep_abandoned
from mgpu_env.runtime.strategy import WorkerRole


def scratch_dir(role: WorkerRole) -> OwnedFolder:
    """A folder of this worker's own for its share of the checkpoints, removed by `close`,
    or (the worker killed) by the next process that sweeps the temporary folder: this
    worker's next start, the launcher's restart or end.

    TensorFlow's checkpoint save is collective, so every worker saves; only the chief's
    copy, in OUTPUT_DIR, is kept (the multi-worker tutorial's `write_filepath` pattern).
    The scratch copies are never read back (a restart gets the chief's values), so those
    of workers that are gone are removed first.
    """
    sweep_abandoned()
    return owned_folder(f"{role.task_type}{role.task_id}-ckpt-")


def remove_scratch_dir(folder: OwnedFolder) -> None:
    folder.remove()
