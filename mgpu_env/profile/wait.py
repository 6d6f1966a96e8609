"""The share of a traced interval its steps spent waiting for their input.

Read from TensorFlow's profiler trace (the XSpace files `tf.profiler.experimental` writes).

The step-time split (`split`) needs steps the converter can find: calls with no
`tf.while_loop` inside (`trace`). Training's calls and `mgpu bench`'s timed intervals take
many steps, and a stream's chunks, inside such a loop, so their input is read from the trace's
events instead: the iterator's get-next ops (`IteratorGetNext`, `IteratorGetNextAsOptional`,
a MultiDeviceIterator's `GetNextFromShard`). An op of these holds the step until its element
is ready, which is what the overview page counts as the host waiting for input; their time,
merged where they overlap (each replica's get-next at once), over the interval's wall time is
the share.

The work a pipeline does on its own threads while the step runs (tf.data's producer and
private-pool threads: the cuts, the map functions, the prefetch) is read from the same trace
as their busy time, summed over the threads: the core time the input took. Where the step
runs on the host's cores (CPU devices) that time is taken from the step without the step
waiting, so the input's cost there is the wait plus the pipeline's share of the cores; where
it runs on a GPU the host's threads cost the step nothing until it waits, so the cost is the
wait alone (`InputWait.cost_share`). `benchmarks/input_cost.py --profile` and
`mgpu bench --explain` set this reading beside the throughput lost.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.profile.split import NoSteps, xspace_files

# The get-next ops' events: `IteratorGetNextAsOptionalOp::DoCompute` as the kernel traces
# itself, `<node>:IteratorGetNext` as the executor names an op.
WAIT_OPS = ("IteratorGetNext", "MultiDeviceIteratorGetNextFromShard")
# The trace's lines (one per thread) of tf.data's threads are named `tf_data_<pool>/<id>`;
# those whose pool takes elements out (`..._get_next...`) are the consumer's side, where the
# step's get-next runs and waits: the rest (`tf_data_iterator_resource`: the prefetch's
# producer, `tf_data_private_threadpool`: a pipeline's own pool) do the pipeline's work.
PIPELINE_THREADS = "tf_data_"
CONSUMER_THREADS = "get_next"


@dataclass(frozen=True)
class InputWait:
    """Milliseconds the traced interval's steps waited for input, of its wall time, and the
    core time the input pipeline's own threads took meanwhile, of the `cores` the process
    may run on."""

    wait_ms: float
    wall_ms: float
    events: int
    pipeline_ms: float = 0.0
    cores: int = 1

    @property
    def share(self) -> float:
        """The wait's share of the interval."""
        return self.wait_ms / self.wall_ms if self.wall_ms > 0 else 0.0

    @property
    def pipeline_share(self) -> float:
        """The pipeline threads' share of the cores' time over the interval."""
        capacity = self.wall_ms * self.cores
        return self.pipeline_ms / capacity if capacity > 0 else 0.0

    def cost_share(self, step_on_host: bool) -> float:
        """The share of the step's throughput the input takes, as the trace reads it: the
        wait, plus the cores the pipeline took where the step computes on those cores."""
        return self.share + (self.pipeline_share if step_on_host else 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {"wait_ms": self.wait_ms, "wall_ms": self.wall_ms, "events": self.events,
                "share": self.share, "pipeline_ms": self.pipeline_ms, "cores": self.cores,
                "pipeline_share": self.pipeline_share,
                "source": "TensorFlow's profiler trace: the iterator's get-next ops (the "
                          "wait), tf.data's producer and pool threads (the pipeline)"}


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


def is_pipeline_thread(line_name: str) -> bool:
    """Whether a trace line (a thread) is one of tf.data's that does the pipeline's work."""
    return line_name.startswith(PIPELINE_THREADS) and CONSUMER_THREADS not in line_name


def pipeline_ms(xspace: Any) -> float:
    """The core time, in ms, of tf.data's pipeline threads in the XSpace: each thread's
    events merged (nested events once), summed over the threads. An event's time is the
    thread's wall time inside it: a thread blocked in one (a slow file read) counts as busy,
    so where the input reads from a slow disk this reads high."""
    total = 0.0
    for plane in xspace.planes:
        for line in plane.lines:
            if is_pipeline_thread(line.name):
                total += merged_ms(
                    (event.offset_ps, event.offset_ps + event.duration_ps)
                    for event in line.events
                )
    return total


def host_cores() -> int:
    """The cores this process may run on (its affinity, as a container's cpuset limits it;
    a CPU quota, `docker run --cpus`, is not seen: the share then reads low)."""
    return len(os.sched_getaffinity(0))


def read_wait(xspaces: Sequence[Path], wall_ms: float) -> InputWait:
    """The input wait and the pipeline's core time in these XSpace files, over an interval
    of `wall_ms`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    if not xspaces:
        raise NoSteps("no profile was written (no .xplane.pb file)")
    intervals, pipeline = [], 0.0
    for path in xspaces:
        xspace = xplane_pb2.XSpace()
        xspace.ParseFromString(path.read_bytes())
        intervals += wait_intervals(xspace)
        pipeline += pipeline_ms(xspace)
    return InputWait(merged_ms(intervals), wall_ms, len(intervals), pipeline, host_cores())


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
