"""Small pieces of the messages a run prints.

Counts with their nouns, file kinds by name, and the causes behind a file that cannot be read,
said without the library's internals."""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from mgpu_env.hardware.folders import FolderAccess

if TYPE_CHECKING:  # numpy only where a .npy file failed: the CLI starts without it
    import numpy as np

# What `DATASET=kind:DIR` holds, as a sentence names it ("TFRecord files in /data/x").
FILE_KIND_NOUNS = {"tfrecord": "TFRecord files", "images": "image files", "npy": ".npy files"}


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 step`, `2 steps` (`many` for nouns that do not just take an s)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def npy_problem(path: Path, err: Exception) -> str:
    """Why numpy cannot open `path` as a .npy array, in words a user can act on: a file cut
    short, one that is not a .npy file at all, one of Python objects, or numpy's own words
    (on one line) for anything else."""
    header = _npy_header(path)
    if header is None:
        # numpy reads a file without the .npy header as a pickle, and says so.
        return "it is not a .npy file (it does not start with the .npy header)"
    shape, dtype, data_start = header
    if dtype.hasobject:
        return "it holds Python objects, not numbers"
    expected = data_start + math.prod(shape) * dtype.itemsize
    size = os.path.getsize(path)
    if size < expected:
        return (
            f"it is cut short: its header says {shape} {dtype} ({expected:,} bytes with the "
            f"header), but the file has {size:,} bytes"
        )
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__).rstrip(".")


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """The shape, dtype and data offset a .npy file's header gives; None when it has none."""
    import numpy as np

    try:
        with open(path, "rb") as file:
            major, _ = np.lib.format.read_magic(file)
            read = (np.lib.format.read_array_header_1_0 if major == 1
                    else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read(file)
            return tuple(shape), np.dtype(dtype), file.tell()
    except (OSError, ValueError, SyntaxError, TypeError):
        return None


def unwritable_folder(access: FolderAccess, setting: str = "OUTPUT_DIR") -> str:
    """Why the run folder cannot be written, and the fix, as the error says it. Ownership is
    the usual cause (a container's uid over a host's folder: `FolderAccess.problem`), but
    not on a read-only filesystem, nor for a folder this user owns."""
    which = "" if access.decides == access.path else f" (it would be created in {access.decides})"
    where = f"{setting}={access.path} cannot be written{which}"
    try:
        status = os.statvfs(access.decides)
    except OSError:
        status = None
    if status is not None and status.f_flag & os.ST_RDONLY:
        return (
            f"{where}: {access.decides} is on a read-only filesystem.\n  Fix: choose an "
            f"{setting} on a writable one, or mount it read-write (in Docker: a volume "
            "without `:ro`)."
        )
    if access.owner_uid == access.process_uid:
        mode = stat.S_IMODE(os.stat(access.decides).st_mode)
        return (
            f"{where}: {access.decides} is this user's (uid {access.process_uid}) but its "
            f"permissions (mode {mode:04o}, or an immutable attribute) forbid writing.\n"
            f"  Fix: `chmod u+w {access.decides}`, or choose another {setting}."
        )
    return f"{access.problem(setting)}.\n  Fix: {access.fix()}."

def tensorflow_message(err: Exception) -> str:
    """A TensorFlow error's own words, on one line, without the graph's node and tf.data's
    stage names: "corrupted record at 1232", "Invalid PNG data, size 268"."""
    text = str(getattr(err, "message", "") or err)
    text = re.sub(r"\{\{[^}]*\}\}|\[\[[^\]]*\]\]|\[Op:[^\]]*\]", "", text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"^.*Iterator::[\w:]+:|\bname:\s*$", "", text).strip()
    if text.startswith("assertion failed:"):  # tf.debugging.Assert's "[label] [7] [...]"
        text = re.sub(r"[\[\]]", "", text.removeprefix("assertion failed:"))
    return text.strip().removesuffix(".") or type(err).__name__


def checkpoint_kept(epoch: int) -> str:
    """What a run stopped during `epoch` (0-based) without a save of its own leaves to
    resume from, for its message: every completed epoch is checkpointed, and the epoch being
    trained up to its last checkpoint inside it (CHECKPOINT_EVERY), if it reached one."""
    inside = f"the latest checkpoint inside epoch {epoch + 1} (CHECKPOINT_EVERY)"
    if not epoch:
        return f"no epoch had completed; {inside}, if any, is kept"
    return f"the checkpoint of epoch {epoch} is kept, or {inside}"
