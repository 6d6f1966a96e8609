"""The input formats as a share of synthetic, beside tuned Keras `model.fit` pipelines.

    .venv/bin/python benchmarks/format_cost.py [--runs 3] [--rows 20000] [--samples 20480]
        [--rounds 5] [--shards 8] [--execution 100] [--data DIR]

Data: scikit-learn's digits as 28x28x1 uint8 images, the training rows repeated to `--rows`
(cut to whole batches of 128), written once into DIR/tfrecord (`--shards` TFDS-style files
of `tf.train.Example`s holding PNG-encoded images, not raw bytes), DIR/images (PNGs, a
folder per class) and DIR/npy (uint8 arrays), and counted once (`data.files`).

A run is one process per replica count (the CPU split into logical devices, as
`VIRTUAL_DEVICES` does) taking intervals of `--samples` samples of each feed in turn,
rounds in a rotating order, after a warm-up round. Each feed trains a model of its own: the
tutorial's MLP (a Flatten first for 28x28x1), batch 64 per replica, fp32, Adam, no XLA.

- The training module's step (`build_trainer`) fed by the library's feeds (`make_feed`):
  synthetic (`mgpu bench`'s `SameBatchFeed`: one batch on each device, reused), kept
  (`ResidentFeed`) and streamed (`StreamFeed`) from the rows in memory, and tfrecord,
  images (`FileStreamFeed`) and npy (`StreamFeed`, memory-mapped) streamed, as data over
  the keep limit is (a limit of 0). Timed: `run(steps)` until the step counter reads back.
- Keras `model.fit`, same model and strategy, `steps_per_execution=--execution`,
  `jit_compile=False`, loss and accuracy as the step has them: one `fit` per feed for the
  whole run, in a thread that waits for its turn at each epoch's start; an epoch is one
  interval (`steps_per_epoch`) of a repeated data set, so iterator and pipeline live on as
  in one long fit. Timed: the epoch's first `on_train_batch_begin` (its iterator made) to
  `on_epoch_end`, until the step counter reads back. tfrecord:
  `TFRecordDataset(files, num_parallel_reads=AUTOTUNE)` -> `map(parse, decode_png, /255;
  num_parallel_calls=AUTOTUNE)` -> `batch` -> `prefetch(AUTOTUNE)`, records not shuffled
  (the library's stream shuffles 10,000); images: `image_dataset_from_directory` (shuffled
  files) -> `map(/255)` -> `cache()` (filled in the warm-up) -> `prefetch(AUTOTUNE)`, and
  the same without `cache()` (streamed from the files, as the library's feed is); npy:
  shuffled indices -> `batch` -> parallel `map` of a `tf.numpy_function` reading the rows
  of `np.load(mmap_mode="r")` -> `prefetch`. For fit's own cost: one global batch repeated
  (`Dataset.from_tensors(...).repeat()`), and `fit(x, y)` on the arrays in memory (Keras'
  own pipeline; each of its turns one pass over the rows, without the new iterator Keras
  makes for each: up to 0.9 s, mostly idle, per epoch when measured alone).

Per feed: the median over rounds of its samples/s over synthetic's in that round, and the
range; also per CPU second of the process (steadier on a shared machine). `--runs N` (no
`--replicas`) runs each replica count in N fresh processes, the counts alternating, and
prints the median over runs of each run's median, with the range of those medians.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

BATCH = 64
SEED = 42
WHOLE = 2 * BATCH  # rows cut to whole global batches at 1 and 2 replicas
TABLE = [  # (feed, its row in the table)
    ("kept", "kept (ResidentFeed)"), ("streamed", "streamed (StreamFeed)"),
    ("tfrecord", "tfrecord PNG (FileStreamFeed)"), ("fit tfrecord", "  fit: TFRecordDataset"),
    ("images", "images PNG (FileStreamFeed)"), ("fit images", "  fit: image_dataset+cache"),
    ("fit images, no cache", "  fit: image_dataset"),
    ("npy", "npy mmap (StreamFeed)"), ("fit npy", "  fit: mmap+numpy_function"),
    ("fit synthetic", "fit: one batch repeated"), ("fit arrays", "fit: numpy arrays"),
]
RESULT = "RESULT "


def digits_uint8(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x_train, y_train, x_test, y_test: uint8 28x28x1 images, training rows repeated."""
    from mgpu_env.training.input.data import load_arrays, resolve_dataset

    arrays = load_arrays(resolve_dataset("digits", None), SEED)

    def images(x: np.ndarray) -> np.ndarray:
        return np.round(x * 255).astype(np.uint8).reshape(-1, 28, 28, 1)

    repeat = -(-rows // arrays.train_size)
    keep = repeat * arrays.train_size // WHOLE * WHOLE
    return (np.tile(images(arrays.x_train), (repeat, 1, 1, 1))[:keep],
            np.tile(arrays.y_train, repeat)[:keep], images(arrays.x_test), arrays.y_test)


def write_folders(root: Path, rows: int, shards: int) -> None:
    """root/tfrecord, root/images and root/npy: the same rows in each layout."""
    import tensorflow as tf

    x_train, y_train, x_test, y_test = digits_uint8(rows)
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        (root / "npy").mkdir(parents=True, exist_ok=True)
        (root / "tfrecord").mkdir(exist_ok=True)
        np.save(root / "npy" / f"x_{split}.npy", x)
        np.save(root / "npy" / f"y_{split}.npy", y.astype(np.int64))
        pngs = [bytes(tf.io.encode_png(image).numpy()) for image in x]
        count = shards if split == "train" else 1
        for shard in range(count):
            name = root / "tfrecord" / f"digits-{split}.tfrecord-{shard:05d}-of-{count:05d}"
            with tf.io.TFRecordWriter(str(name)) as out:
                for i in range(shard, len(x), count):
                    out.write(tf.train.Example(features=tf.train.Features(feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[pngs[i]])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[i]])),
                    })).SerializeToString())
        for i, label in enumerate(y):
            folder = root / "images" / split / f"class_{label}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:06d}.png").write_bytes(pngs[i])


class FitTurns:
    """One `model.fit` in a thread of its own, one epoch per turn: a call lets it run its
    next epoch and returns that epoch's samples/s."""

    def __init__(self, model: Any, global_batch: int, epochs: int, **fit: Any) -> None:
        from mgpu_env.runtime.keras import tensorflow_keras

        keras = tensorflow_keras()
        self.model, self.global_batch = model, global_batch
        self.go = threading.Semaphore(0)
        self.done: queue.Queue[tuple[float, float] | BaseException] = queue.Queue()
        self.start: float | None = None
        self.cpu, self.first = 0.0, 0
        timer = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: self.go.acquire(),
            on_train_batch_begin=self._begin, on_epoch_end=self._end)
        fit.update(epochs=epochs, verbose=0, callbacks=[timer])
        self.thread = threading.Thread(target=self._fit, args=(fit,), daemon=True)
        self.thread.start()

    def _fit(self, fit: dict[str, Any]) -> None:
        try:
            self.model.fit(**fit)
        except BaseException as err:  # handed to the caller waiting for this turn
            self.done.put(err)

    def _steps(self) -> int:
        return int(self.model.optimizer.iterations.numpy())  # waits for the steps queued

    def _begin(self, batch: int, logs: Any = None) -> None:
        if self.start is None:  # the epoch's first: its iterator is made
            self.first = self._steps()
            self.start, self.cpu = time.perf_counter(), time.process_time()

    def _end(self, epoch: int, logs: Any = None) -> None:
        samples = (self._steps() - self.first) * self.global_batch
        assert self.start is not None
        self.done.put((samples / (time.perf_counter() - self.start),
                       samples / (time.process_time() - self.cpu)))
        self.start = None

    def __call__(self) -> tuple[float, float]:
        self.go.release()
        result = self.done.get(timeout=600)
        if isinstance(result, BaseException):
            raise result
        return result


def measure(args: argparse.Namespace) -> tuple[dict[str, list[tuple[float, float]]], Any]:
    """One process: each feed's samples per second and per CPU second of the process, round
    by round, after the warm-up; and the feeds (see `one_run`)."""
    from mgpu_env.hardware.devices import DeviceSplit, apply_split

    devices = (apply_split(DeviceSplit("CPU", 1, args.replicas)) if args.replicas > 1
               else ("/device:CPU:0",))
    import tensorflow as tf

    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.runtime.keras import tensorflow_keras
    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.input.data import Arrays, load_data, resolve_dataset
    from mgpu_env.training.input.feeds import FeedMaking, make_feed, plan_feed
    from mgpu_env.training.input.keep import FALLBACK, KeepLimit
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model, build_optimizer
    from mgpu_env.training.step.steps import StepSpec

    keras = tensorflow_keras()
    strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, len(devices))))
    batch, auto = BATCH * args.replicas, tf.data.AUTOTUNE  # the global batch
    steps = args.samples // batch
    x8, y8, x8_test, y8_test = digits_uint8(args.rows)
    flat = Arrays("digits", (x8.reshape(len(x8), -1) / 255).astype(np.float32), y8,
                  (x8_test.reshape(len(x8_test), -1) / 255).astype(np.float32), y8_test)
    files = {kind: load_data(resolve_dataset(f"{kind}:{args.data / kind}", None), SEED)
             for kind in ("tfrecord", "images", "npy")}
    warmup = 1 + len(x8) // args.samples  # the cached images' pipeline reads every file once
    rounds = warmup + args.rounds
    feeds: dict[str, Callable[[], tuple[float, float]]] = {}

    def step_feed(name: str, shape: tuple[int, ...], runner: Callable[[Any], Any]) -> None:
        trainer = build_trainer(strategy, lambda: build_model(SEED, shape),
            StepSpec(learning_rate=0.001,
                     precision=PrecisionChoice(FLOAT32, False, "benchmark"),
                     global_batch_size=batch, jit_compile=False))
        run = runner(trainer)

        def interval() -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.process_time()
            run(steps)
            trainer.optimizer.iterations.numpy()  # waits for the steps queued
            return (steps * batch / (time.perf_counter() - start),
                    steps * batch / (time.process_time() - cpu))

        feeds[name] = interval

    def library_feed(data: Any, keep: KeepLimit) -> Callable[[Any], Any]:
        def runner(trainer: Any) -> Any:
            feed_plan = plan_feed(data, keep, batch)
            feed = make_feed(FeedMaking(strategy, data, feed_plan, batch, SEED))
            epochs = -(-steps * rounds // feed_plan.steps_per_epoch)
            return trainer.loops.runner(feed.source(Position(0), epochs))
        return runner

    same = SameBatchFeed.make(strategy, BATCH, (784,), 10, SEED)
    step_feed("synthetic", (784,), lambda t: t.loops.runner(same.source(Position(0))))
    stream = KeepLimit(0, "benchmark: stream")
    step_feed("kept", (784,), library_feed(flat, FALLBACK))
    step_feed("streamed", (784,), library_feed(flat, stream))
    for kind, data in files.items():
        step_feed(kind, data.sample_shape, library_feed(data, stream))

    def fit_feed(name: str, shape: tuple[int, ...], **fit: Any) -> None:
        with strategy.scope():
            model = build_model(SEED, shape)
            model.compile(optimizer=build_optimizer(0.001, False),
                          loss=keras.losses.SparseCategoricalCrossentropy(),
                          metrics=["accuracy"], steps_per_execution=args.execution,
                          jit_compile=False)
        if "y" not in fit:  # a data set: batched, repeated, shuffled where it says so
            fit.update(steps_per_epoch=steps, shuffle=False)
        feeds[name] = FitTurns(model, batch, rounds, **fit)

    def parse(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)})
        image = tf.io.decode_png(example["image"], channels=1)
        return tf.cast(image, tf.float32) / 255, tf.cast(example["label"], tf.int32)

    shards = sorted(str(path) for path in (args.data / "tfrecord").glob("*-train.tfrecord-*"))
    records = tf.data.TFRecordDataset(shards, num_parallel_reads=auto).repeat()
    fit_feed("fit tfrecord", (28, 28, 1), x=records.map(parse, num_parallel_calls=auto)
             .batch(batch, drop_remainder=True).prefetch(auto))
    with contextlib.redirect_stdout(io.StringIO()):  # "Found N files belonging to 10 classes."
        images = keras.utils.image_dataset_from_directory(
            args.data / "images" / "train", color_mode="grayscale", batch_size=batch,
            image_size=(28, 28), shuffle=True, seed=SEED)
    scaled = images.map(lambda x, y: (x / 255, tf.cast(y, tf.int32)), num_parallel_calls=auto)
    fit_feed("fit images", (28, 28, 1), x=scaled.cache().repeat().prefetch(auto))
    fit_feed("fit images, no cache", (28, 28, 1), x=scaled.repeat().prefetch(auto))
    mapped = np.load(args.data / "npy" / "x_train.npy", mmap_mode="r")
    labels = np.load(args.data / "npy" / "y_train.npy").astype(np.int32)

    def read_rows(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = np.sort(index)  # the file read in order
        return (mapped[index] / np.float32(255)).astype(np.float32), labels[index]

    def read(index: Any) -> tuple[Any, Any]:
        x, y = tf.numpy_function(read_rows, [index], (tf.float32, tf.int32), stateful=False)
        return tf.ensure_shape(x, (batch, 28, 28, 1)), tf.ensure_shape(y, (batch,))

    fit_feed("fit npy", (28, 28, 1), x=tf.data.Dataset.range(len(labels)).shuffle(
        len(labels), seed=SEED).repeat().batch(batch, drop_remainder=True)
        .map(read, num_parallel_calls=auto).prefetch(auto))
    fit_feed("fit synthetic", (784,), x=tf.data.Dataset.from_tensors(
        (flat.x_train[:batch], flat.y_train[:batch])).repeat())
    fit_feed("fit arrays", (784,), x=flat.x_train, y=flat.y_train, batch_size=batch)

    names = list(feeds)
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_ in range(rounds):
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            rate = feeds[name]()
            if round_ >= warmup:
                rates[name].append(rate)
    return rates, feeds


def one_run(args: argparse.Namespace) -> None:
    rates, _alive = measure(args)
    print(f"{args.replicas} replica(s), batch {BATCH} per replica, {args.rounds} rounds of "
          f"{args.samples} samples per feed, interleaved; % of synthetic in the same round:")
    summary: dict[str, list[float]] = {}  # samples/s; wall % median, min, max; CPU % too
    for name, values in rates.items():
        summary[name] = [statistics.median(v[0] for v in values)]
        for kind in (0, 1):
            ratios = [100 * v[kind] / s[kind]
                      for v, s in zip(values, rates["synthetic"], strict=True)]
            summary[name] += [statistics.median(ratios), min(ratios), max(ratios)]
        print(f"  {name:20} {summary[name][0]:9,.0f} samples/s {summary[name][1]:6.1f}% "
              f"(rounds {summary[name][2]:.0f}-{summary[name][3]:.0f}%), per CPU second "
              f"{summary[name][4]:6.1f}% ({summary[name][5]:.0f}-{summary[name][6]:.0f}%)",
              flush=True)
    print(RESULT + json.dumps(summary), flush=True)
    # The process ends with the feeds (`_alive`) alive: tearing their pipelines down
    # mid-stream while the fits end in their threads waited idle for up to a minute.
    os._exit(0)


def many_runs(args: argparse.Namespace) -> None:
    results: dict[int, list[dict[str, list[float]]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="format-cost-") as temporary:
        data = args.data or Path(temporary)
        if not (data / "npy" / "x_train.npy").is_file():
            write_folders(data, args.rows, args.shards)
        from mgpu_env.training.input.data import load_data, resolve_dataset

        for kind in ("tfrecord", "images"):  # counted here once, into each folder's cache
            load_data(resolve_dataset(f"{kind}:{data / kind}", None), SEED)
        for run in range(args.runs):
            for replicas in (1, 2):
                done = subprocess.run(
                    [sys.executable, __file__, "--replicas", str(replicas), "--data", str(data),
                     *(f"--{key}={getattr(args, key)}" for key in
                       ("rows", "samples", "rounds", "execution"))],
                    capture_output=True, text=True, check=False)
                found = re.search(f"^{RESULT}(.*)$", done.stdout, re.MULTILINE)
                if done.returncode or not found:
                    sys.exit(f"run {run + 1}, {replicas} replica(s) failed:\n{done.stderr}")
                print(f"run {run + 1}:", done.stdout[:found.start()], end="", flush=True)
                results[replicas].append(json.loads(found[1]))

    def cell(replicas: int, name: str, at: int) -> str:
        values = [r[name][at] for r in results[replicas]]
        middle, low, high = statistics.median(values), min(values), max(values)
        if at == 0:
            return f"{middle:,.0f} ({low:,.0f}-{high:,.0f})"
        return f"{middle:.1f}% ({low:.1f}-{high:.1f})"

    for at, what in ((1, "samples/s"), (4, "samples per CPU second of the process")):
        print(f"\n% of synthetic, {what}:\n{'':30} {'1 replica':>25} {'2 replicas':>25}")
        if at == 1:
            print(f"{'synthetic, samples/s':30} {cell(1, 'synthetic', 0):>25} "
                  f"{cell(2, 'synthetic', 0):>25}")
        for name, label in TABLE:
            print(f"{label:30} {cell(1, name, at):>25} {cell(2, name, at):>25}")
    print(f"\nMedian (min-max) over {args.runs} runs of each run's median of per-round "
          f"ratios to synthetic: {args.rounds} rounds of {args.samples} samples per feed (fit "
          "arrays: one pass over the rows, its set-up left out), interleaved in one process "
          f"per run and replica count; digits repeated to {args.rows} rows, batch {BATCH} per "
          "replica, the CPU split into logical devices; fit: steps_per_execution="
          f"{args.execution}, no XLA.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--replicas", type=int, help="one run, at this count (needs --data)")
    parser.add_argument("--rows", type=int, default=20_000, help="training rows (repeated)")
    parser.add_argument("--samples", type=int, default=20_480, help="samples per interval")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", type=int, default=8, help="training TFRecord files")
    parser.add_argument("--execution", type=int, default=100, help="fit's steps_per_execution")
    parser.add_argument("--data", type=Path, help="where the folders are written (kept)")
    args = parser.parse_args()
    if args.replicas is None:
        many_runs(args)
    elif args.data is None:
        parser.error("--replicas needs --data, a folder a run without --replicas wrote")
    else:
        one_run(args)


if __name__ == "__main__":
    main()
