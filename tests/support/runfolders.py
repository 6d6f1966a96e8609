"""What the slow tests read from a run folder and a run's log, the way a user would."""

from __future__ import annotations

import re
from pathlib import Path


def completed_epochs(run: Path) -> int:
    """The epochs completed at the chief's latest checkpoint (history.json is written just
    before an epoch's): `ckpt-<E>`, or `ckpt-<E>-<S>` inside epoch E + 1."""
    try:
        index = (run / "checkpoints" / "checkpoint").read_text()
    except OSError:
        return 0
    found = re.search(r'^model_checkpoint_path: "ckpt-(\d+)(?:-\d+)?"', index, re.M)
    return int(found.group(1)) if found else 0


def epoch_losses(log: str) -> list[str]:
    """The loss at the end of each epoch, from the plain line per epoch a log gets (its
    output is a file or a pipe, so no progress bar); a line may carry a prefix such as
    compose's `worker0_1  | `."""
    return re.findall(r"Epoch \d+/\d+: loss ([0-9.]+),", log)
