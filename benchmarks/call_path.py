"""The calls and files of mgpu-env a reader follows from `mgpu train` to the first step.

    .venv/bin/python benchmarks/call_path.py [SETTING=VALUE ...]

Runs `mgpu train` in this process (default GPUS=none DATASET=digits EPOCHS=1, into a
temporary OUTPUT_DIR), with `sys.setprofile` watching every call into the repository's code
(`mgpu_env/`, `entrypoint/`), until the replica's training step is first entered (traced by
the first compiled call: `StepFunctions.replica_step`, in a replica's thread). TensorFlow
is imported before the watch starts, so its import adds nothing but its own time. Prints:

- chain: the repository's frames on the stack at the first step, outermost first: the
  calls a reader descends from the command to the step, and the files they cross;
- path: every distinct function of the repository called before it (module bodies and
  comprehensions left out), and the files they live in: how much a reader meets on the way.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OURS = (str(REPO / "mgpu_env") + os.sep, str(REPO / "entrypoint") + os.sep)
SKIPPED = {"<module>", "<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>"}
FIRST_STEP = "replica_step"
DEFAULTS = {"GPUS": "none", "DATASET": "digits", "EPOCHS": "1", "QUIET": "1"}


def ours(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(OURS)


def where(frame: FrameType) -> tuple[str, str]:
    path = os.path.relpath(frame.f_code.co_filename, REPO)
    return path, frame.f_code.co_qualname


def main(argv: list[str]) -> int:
    bad = [arg for arg in argv if "=" not in arg or arg.startswith("=")]
    if bad:  # --help included: the docstring is the usage
        print(f"error: not SETTING=VALUE: {' '.join(bad)}\n{__doc__}", file=sys.stderr)
        return 2
    settings = dict(DEFAULTS, **dict(a.split("=", 1) for a in argv))
    os.environ.update(settings)
    sys.path.insert(0, str(REPO))
    import tensorflow  # noqa: F401  (its import is not the path being measured)

    from entrypoint.app import app

    seen: dict[tuple[str, str], None] = {}
    chain: list[tuple[str, str]] = []

    def watch(frame: FrameType, event: str, _: Any) -> None:
        if event != "call" or not ours(frame):
            return
        if frame.f_code.co_name == FIRST_STEP and not chain:
            # MirroredStrategy runs each replica's function in a thread of its own: the
            # caller's frames are those of the thread that waits for it (the main one).
            frames = [frame]
            if threading.current_thread() is not threading.main_thread():
                frames.append(sys._current_frames()[threading.main_thread().ident or 0])
            for at in frames:
                stack = []
                while at is not None:
                    if ours(at) and at.f_code.co_name not in SKIPPED:
                        stack.append(where(at))
                    at = at.f_back  # type: ignore[assignment]
                chain[:0] = reversed(stack)
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            return
        if frame.f_code.co_name not in SKIPPED:
            seen.setdefault(where(frame), None)

    with tempfile.TemporaryDirectory() as folder:
        os.environ["OUTPUT_DIR"] = str(Path(folder) / "run")
        threading.setprofile(watch)  # the replicas' threads too
        sys.setprofile(watch)
        try:
            app(["train"], standalone_mode=False)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    if not chain:
        print("the step was never entered", file=sys.stderr)
        return 1
    print(f"settings: {' '.join(f'{k}={v}' for k, v in settings.items())}")
    print(f"chain to the first step: {len(chain)} calls across "
          f"{len({path for path, _ in chain})} files")
    for path, name in chain:
        print(f"  {path}:{name}")
    print(f"path to the first step: {len(seen)} distinct functions in "
          f"{len({path for path, _ in seen})} files")
    training = [(path, name) for path, name in seen if path.startswith("mgpu_env/training/")]
    print(f"  of which in mgpu_env/training/: {len(training)} functions in "
          f"{len({path for path, _ in training})} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
