"""Importing TensorFlow quietly: its C++ start-up lines are kept, and shown only when needed.

TensorFlow 2.21's import writes to file descriptor 2 from C++ (absl's "All log messages
before absl::InitializeLog()", `cudart_stub`, oneDNN), and `TF_CPP_MIN_LOG_LEVEL` does not
hide all of them (tensorflow#62781, #85604). A healthy start should say nothing on stderr,
so the first import runs with fd 2 redirected to a temporary file; the lines are written
back when the import fails, or when the start-up log was asked for (`mgpu --debug`,
`MGPU_DEBUG=1`). Python's `sys.stderr` is a layer above fd 2, so this catches C++ and
Python alike.

Every in-process first import goes through `import_tensorflow()`; later calls return the
module Python already holds, so TensorFlow is imported once per process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import IO, TypeVar

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")


@dataclass
class StartupLog:
    """Whether TensorFlow's start-up log is shown: the CLI sets it from --debug/MGPU_DEBUG;
    a process started without the CLI (a `mgpu bench` point) reads MGPU_DEBUG."""

    show: bool = os.environ.get("MGPU_DEBUG", "").strip().lower() in _TRUE


STARTUP_LOG = StartupLog()


@contextlib.contextmanager
def _fd2_into(sink: IO[bytes]) -> Iterator[None]:
    """Point file descriptor 2 at `sink` for the block, then back where it was."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(sink.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _replay(sink: IO[bytes]) -> None:
    sink.flush()
    sink.seek(0)
    text = sink.read()
    if text:
        sys.stderr.flush()
        os.write(2, text)


def run_quietly(action: Callable[[], T], *, show: bool = False) -> T:
    """Run `action` with what it writes to fd 2 held back; written out after all when
    `action` raises, or when `show` is true."""
    with tempfile.TemporaryFile() as sink:
        try:
            with _fd2_into(sink):
                result = action()
        except BaseException:
            _replay(sink)
            raise
        if show:
            _replay(sink)
        return result


def _import() -> ModuleType:
    import tensorflow

    return tensorflow


def import_tensorflow(*, show: bool | None = None) -> ModuleType:
    """TensorFlow, imported quietly the first time (see the module's docstring).

    Call only after the runtime's environment is applied (CUDA_VISIBLE_DEVICES, ...).
    `show` overrides `STARTUP_LOG.show`. Import errors propagate, after the log is shown.
    """
    module = sys.modules.get("tensorflow")
    if module is not None:
        return module
    return run_quietly(_import, show=STARTUP_LOG.show if show is None else show)
