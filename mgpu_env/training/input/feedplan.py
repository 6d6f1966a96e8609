"""Which feed a run takes, decided once from the data and the run's keep limit.

`plan_feed` is the one place that decides whether the training rows are kept on every
device or streamed, and how many steps an epoch has; the plan records its `FeedPlan`
(known before any data is read for a built-in set, whose sizes are official; after
`prepare` loads a loader's or a folder's data), `feed.make_feed` builds what it names, and
`data.load_arrays` and `mgpu bench` ask it too. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mgpu_env.training.input.data.read import steps_per_epoch
from mgpu_env.training.input.data.sets import Data, DataSizes, FileData, Streamed
from mgpu_env.training.input.keep import GIB, KeepLimit, rows_bytes

# resident: kept on every device (`feed.ResidentFeed`); stream: arrays in host memory cut
# into chunks (`StreamFeed`); row_stream: a loader's tf.data set too big to read
# (`RowStreamFeed`); file_stream: files over the limit, each worker its share
# (`FileStreamFeed`).
FeedKind = Literal["resident", "stream", "row_stream", "file_stream"]


@dataclass(frozen=True)
class FeedPlan:
    """How training batches will reach the step, the steps of an epoch, and why, in a short
    sentence for the start summary."""

    kind: FeedKind
    steps_per_epoch: int
    why: str

    def describe(self) -> dict[str, str | int]:
        return {"kind": self.kind, "steps_per_epoch": self.steps_per_epoch, "why": self.why}


def plan_feed(
    data: Data | DataSizes, keep: KeepLimit, global_batch: int, workers: int = 1
) -> FeedPlan:
    """The feed for `data` under the run's `keep` limit: a loader's stream streams; rows
    within the limit are kept on every device (files read whole); rows over it stream from
    host memory, or (files) from the files. `DataSizes` stands for a built-in set's arrays,
    not read yet. Steps per epoch: whole global batches; files streamed by file, the whole
    global batches every worker's share of the files gives."""
    rows = data.train_size
    if isinstance(data, Streamed):
        return FeedPlan("row_stream", rows // global_batch,
                        f"your loader's {rows:,} rows are a tf.data set too big to read: "
                        "they stream from its pipeline")
    size = rows_bytes(data.sample_shape, rows)
    limit = f"the keep limit of {keep.bytes / GIB:.1f} GiB on each device"
    what = f"{rows:,} {'decoded ' if isinstance(data, FileData) else ''}rows ({_bytes(size)})"
    if keep.keeps(size):
        read = ": read whole from the files" if isinstance(data, FileData) else ""
        return FeedPlan("resident", rows // global_batch, f"{what} fit {limit}{read}")
    if isinstance(data, FileData):
        return FeedPlan("file_stream", steps_per_epoch(data.train, global_batch, workers),
                        f"{what} are over {limit}: each worker streams its share of the files")
    return FeedPlan("stream", rows // global_batch,
                    f"{what} are over {limit}: they stream from host memory")


def _bytes(size: int) -> str:
    if size >= 1e9:
        return f"{size / 1e9:.1f} GB"
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
