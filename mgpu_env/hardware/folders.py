"""Whether this process can write the run folder, asked before TensorFlow starts.

A container that runs as one uid over a mounted `runs/` owned by another cannot write its
checkpoints; without this check that shows as a PermissionError deep in a save, after the
data has loaded and the model has compiled. Both `mgpu train` and `mgpu doctor` ask here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

RUNS_ROOT = Path("runs")
FIX_OWNER = (
    "run as the folder's owner: in Docker, `HOST_UID=$(id -u) HOST_GID=$(id -g) docker "
    "compose run --rm train` (or `make docker-train`, which sets them); elsewhere, choose "
    "another OUTPUT_DIR, or give the folder to this user (`sudo chown -R $(id -u) FOLDER`)"
)


@dataclass(frozen=True)
class FolderAccess:
    """The run folder, and the folder whose permissions decide whether it can be written:
    itself, or, when it does not exist yet, the nearest parent that does."""

    path: Path
    decides: Path
    writable: bool
    owner_uid: int
    process_uid: int

    def problem(self, setting: str = "OUTPUT_DIR") -> str | None:
        """What is wrong, on one line, with the values; None when it can be written."""
        if self.writable:
            return None
        which = "" if self.decides == self.path else f" (it would be created in {self.decides})"
        return (
            f"{setting}={self.path} cannot be written{which}: {self.decides} belongs to uid "
            f"{self.owner_uid} and this process runs as uid {self.process_uid}"
        )

    def fix(self) -> str:
        return FIX_OWNER.replace("FOLDER", str(self.decides))


def folder_access(path: Path) -> FolderAccess:
    """Whether this process may create files in `path` (or create `path` itself)."""
    decides = path
    while not decides.exists() and decides != decides.parent:
        decides = decides.parent
    try:
        owner = decides.stat().st_uid
    except OSError:
        owner = -1
    # os.access asks the kernel with this process's real ids, the ones it will write with.
    writable = decides.is_dir() and os.access(decides, os.W_OK | os.X_OK)
    return FolderAccess(path, decides, writable, owner, os.getuid())
