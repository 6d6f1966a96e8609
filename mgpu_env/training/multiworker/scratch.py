"""A non-chief worker's scratch folder for its share of the (collective) checkpoints."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mgpu_env.runtime.strategy import WorkerRole


def scratch_dir(role: WorkerRole) -> Path:
    """A private folder for a non-chief worker's share of the checkpoints, deleted after.

    TensorFlow's checkpoint save is collective, so every worker saves; only the chief's
    copy, in OUTPUT_DIR, is kept (the multi-worker tutorial's `write_filepath` pattern).
    """
    return Path(tempfile.mkdtemp(prefix=f"mgpu-{role.task_type}{role.task_id}-ckpt-"))


def remove_scratch_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
