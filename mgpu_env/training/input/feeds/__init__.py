"""How training rows reach the step, one data adapter per kind of feed.

The adapter is chosen by one dispatcher (`registry.plan_feed`), and each only says where its
rows are in order from a position (`kind.Feed.source`); the trainer's compiled loops read them
(`step.loops`).

- `resident`: data that fits (every built-in data set: MNIST's 60,000 rows are 188 MB) is
  copied once onto each local replica's device; each compiled call gathers its steps'
  batches by index, following one permutation per epoch drawn from (SEED, epoch). No host
  work, no host-to-device copy and no tf.data per step: `mgpu bench` measured the
  element-wise tf.data pipeline (from_tensor_slices -> shuffle -> batch ->
  experimental_distribute_dataset) at 67-73% of the CPU's training throughput.
- `stream` (`arrays_stream`): arrays over the run's keep limit (`training.input.keep`) stay
  in host memory, cut into chunks of many steps' batches by one tf.data pipeline per worker,
  prefetched to each replica's device.
- `row_stream` (`loader_stream`): a `DATASET` loader's tf.data set too big to read into
  memory (`data.Streamed`), streamed from its pipeline, shuffled in a buffer.
- `file_stream`: TFRecord files and image folders (`data.FileData`) whose decoded rows do
  not fit (those that fit are read whole into `resident`): each worker streams its share of
  the files (`data.read.worker_rows`), in an order drawn from (SEED, epoch).

The rows' order is `training.input.order`'s. The first three follow one order per epoch (the
first two the same one) and give global batch b of an epoch the same rows whatever the
replica or worker count (`file_stream`'s order is SEED's and the epoch's too, but each
worker reads its own files): replica r (its id across all workers) of R takes rows
[b*G + r*G/R, b*G + (r+1)*G/R) of the epoch's order. The last partial global batch is
dropped (a different one each epoch, as the order changes), so every step has exactly the
global batch G.

A new kind of feed is a new module here with a `KIND` (`kind.FeedKind`) and its tests.
"""

from mgpu_env.training.input.feeds.arrays_stream import StreamFeed
from mgpu_env.training.input.feeds.file_stream import FileStreamFeed
from mgpu_env.training.input.feeds.kind import Feed, FeedKind, FeedMaking, FeedNeed, FeedPlan
from mgpu_env.training.input.feeds.loader_stream import RowStreamFeed
from mgpu_env.training.input.feeds.registry import kind_named, kinds, make_feed, plan_feed
from mgpu_env.training.input.feeds.resident import ResidentFeed

__all__ = [
    "Feed", "FeedKind", "FeedMaking", "FeedNeed", "FeedPlan", "FileStreamFeed",
    "ResidentFeed", "RowStreamFeed", "StreamFeed", "kind_named", "kinds", "make_feed",
    "plan_feed",
]
