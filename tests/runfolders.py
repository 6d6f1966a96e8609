"""What the slow tests read from a run folder, the way a user would."""

from __future__ import annotations

import re
from pathlib import Path


def completed_epochs(run: Path) -> int:
    """The epoch of the chief's latest checkpoint (history.json is written just before it)."""
    try:
        index = (run / "checkpoints" / "checkpoint").read_text()
    except OSError:
        return 0
    found = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', index, re.M)
    return int(found.group(1)) if found else 0
