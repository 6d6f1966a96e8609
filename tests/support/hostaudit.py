"""A guard that fails a test whose probes read the real machine around the fake one.

`sys.addaudithook` sees every `open`, `os.listdir` and `os.scandir` Python makes (pathlib's
reads and globs included). While `watch(root)` is on, a path under /proc, /sys, /dev, /etc
or /run that is not under `root` is recorded; `stop()` returns what was. Children are other
processes (their own reads are theirs: the CUDA driver probe, TensorFlow). A hook cannot be
removed once added, so one is added per process and switched on and off.
"""

from __future__ import annotations

import os
import sys
from typing import Any

WATCHED = ("/proc", "/sys", "/dev", "/etc", "/run")
# What Python and subprocess open for themselves, not facts about the machine.
ALLOWED = ("/dev/null", "/dev/urandom", "/dev/tty")
_STATE: dict[str, Any] = {"root": None, "reads": [], "hooked": False}


def _hook(event: str, args: tuple[Any, ...]) -> None:
    root = _STATE["root"]
    if root is None or event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    path = args[0]
    if path is None or isinstance(path, int):
        return
    try:
        text = os.path.normpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if not os.path.isabs(text) or text == root or text.startswith(root + os.sep):
        return
    if text in ALLOWED:
        return
    if any(text == top or text.startswith(top + "/") for top in WATCHED):
        _STATE["reads"].append(f"{event} {text}")


def watch(root: os.PathLike[str] | str) -> None:
    """Record reads of the real machine from now on (the fake one is `root`)."""
    if not _STATE["hooked"]:
        sys.addaudithook(_hook)
        _STATE["hooked"] = True
    _STATE.update(root=os.path.normpath(os.fspath(root)), reads=[])


def stop() -> list[str]:
    """Stop recording; what was read of the real machine."""
    reads = list(_STATE["reads"])
    _STATE.update(root=None, reads=[])
    return reads
