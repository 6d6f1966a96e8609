"""The share of a traced interval its steps spent waiting for their input, read from
TensorFlow's profiler trace (the XSpace files `tf.profiler.experimental` writes).

The step-time split (`split`) needs steps the converter can find: calls with no
`tf.while_loop` inside (`trace`). Training's calls and `mgpu bench`'s timed intervals take
many steps, and a stream's chunks, inside such a loop, so their input is read from the trace's
events instead: the iterator's get-next ops (`IteratorGetNext`, `IteratorGetNextAsOptional`,
a MultiDeviceIterator's `GetNextFromShard`). An op of these holds the step until its element
is ready, which is what the overview page counts as the host waiting for input; their time,
merged where they overlap (each replica's get-next at once), over the interval's wall time is
the share. The work a pipeline does on other threads while the step runs is not in it: on
a machine of few cores that work slows the step without the step waiting (`benchmarks/
input_cost.py --profile` sets this share beside the throughput lost).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.profile.split import NoSteps, xspace_files

# The get-next ops' events: `IteratorGetNextAsOptionalOp::DoCompute` as the kernel traces
# itself, `<node>:IteratorGetNext` as the executor names an op.
WAIT_OPS = ("IteratorGetNext", "MultiDeviceIteratorGetNextFromShard")


@dataclass(frozen=True)
class InputWait:
    """Milliseconds the traced interval's steps waited for input, of its wall time."""

    wait_ms: float
    wall_ms: float
    events: int

    @property
    def share(self) -> float:
        return self.wait_ms / self.wall_ms if self.wall_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"wait_ms": self.wait_ms, "wall_ms": self.wall_ms, "events": self.events,
                "share": self.share,
                "source": "TensorFlow's profiler trace: the iterator's get-next ops"}


def is_wait_event(name: str) -> bool:
    """Whether a trace event's name is one of the iterator's get-next ops (WAIT_OPS)."""
    kernel = name.split("::", 1)[0]
    op_type = name.rsplit(":", 1)[-1] if "::" not in name else ""
    return any(kernel.startswith(op) or op_type.startswith(op) for op in WAIT_OPS)


def merged_ms(intervals: Iterable[tuple[int, int]]) -> float:
    """Milliseconds covered by (start, end) intervals in picoseconds, overlaps counted once."""
    covered, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            covered += end - start
            reach = end
        elif end > reach:
            covered += end - reach
            reach = end
    return covered / 1e9


def wait_intervals(xspace: Any) -> list[tuple[int, int]]:
    """(start, end) in picoseconds of every get-next event on the XSpace's host planes."""
    found = []
    for plane in xspace.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            origin = line.timestamp_ns * 1000
            for event in line.events:
                if is_wait_event(names.get(event.metadata_id, "")):
                    start = origin + event.offset_ps
                    found.append((start, start + event.duration_ps))
    return found


def read_wait(xspaces: Sequence[Path], wall_ms: float) -> InputWait:
    """The input wait in these XSpace files, over an interval of `wall_ms`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    if not xspaces:
        raise NoSteps("no profile was written (no .xplane.pb file)")
    intervals = []
    for path in xspaces:
        xspace = xplane_pb2.XSpace()
        xspace.ParseFromString(path.read_bytes())
        intervals += wait_intervals(xspace)
    return InputWait(merged_ms(intervals), wall_ms, len(intervals))


def trace_wait(logdir: Path, run: Callable[[], Any]) -> InputWait:
    """Trace `run()` (it must return once its steps are done) into `logdir`; its input
    wait over its wall time."""
    import tensorflow as tf

    logdir.mkdir(parents=True, exist_ok=True)
    before = set(xspace_files(logdir))
    tf.profiler.experimental.start(str(logdir))
    try:
        start = time.perf_counter()
        run()
        wall_ms = 1000.0 * (time.perf_counter() - start)
    finally:
        tf.profiler.experimental.stop()
    # Sessions are named by the second they start (as `trace.trace_steps` waits).
    time.sleep(max(0.0, 1.0 - (time.time() % 1.0)))
    files = xspace_files(logdir)
    return read_wait(files if set(files) != before else [], wall_ms)
