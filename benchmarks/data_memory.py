"""Peak resident memory of `mgpu train` on a data set of several GiB, over its baseline.

    .venv/bin/python benchmarks/data_memory.py [--format npy|tfrecord|both] [--gib 5]
        [--side 28] [--batch-size 256] [--dir DIR] [--keep]

For each format, writes a data set of `--gib` GiB of uint8 images (`--side` x `--side`,
random pixels, labels 0..9) and a small test split into a temporary folder (`--dir`,
default under /tmp; removed at the end unless `--keep`), one format at a time so the disk
holds one of them:

- npy: `x_train.npy` (uint8, N x side x side), `y_train.npy`, `x_test.npy`, `y_test.npy`:
  memory-mapped by `DATASET=npy:DIR`;
- tfrecord: 256 MiB shards of `tf.train.Example`s, raw image bytes and an int64 label, with
  the `dataset.json` that gives their shape.

Then runs the real `mgpu train` (GPUS=none, EPOCHS=1, QUIET=1) on it as a child process:
first `--dry-run`, which counts the folder and caches the counts (a TFRecord folder's
first run decodes every record), then the training run, one whole epoch, reading the
cache. Every 0.2 s it reads the child's /proc/PID/status: VmRSS and its parts (RssAnon:
the process's own memory; RssFile: pages of mapped files it has touched, which stay
counted in its RSS until the kernel needs them back) and VmHWM, the kernel's running peak
of VmRSS; the peak reported is the last VmHWM read (at most 0.2 s before the exit). Not
wait4's ru_maxrss: it counts the parent's pages the child held between fork and exec.

The baseline: the peak RSS of the same command, with the same settings, on a data set of
the same format and image size but only `--tiny-rows` training rows (1% of a GiB), which
the run keeps on the device instead of streaming: TensorFlow's runtime, the model, the
compiled steps, everything but what the data's size adds. So "above baseline" counts the
stream itself (its chunks, prefetch and shuffle buffers) and any pages of the data that
stay resident. The target is under 1.5 GiB above baseline for a 5 GiB data set.

Measured (2 cores shared with other work, 24 GiB, Linux 6.18 on ext4; 6,847,843 rows of
28x28, batch 256, one epoch of 26,749 steps; MiB of peak RSS over the baseline):
- npy, rows cut from the map by NumPy indexing (before `data.sets.take_rows`): +5,300
  (RssFile 5,589: the file's pages; median RSS by quarter 748 / 6,104 / 6,113 / 6,110);
  read by `pread`: +151, +170, +182 in three runs (RssFile as the baseline's, 470; by
  quarter 681 / 980 / 977 / 979). About 2.5 minutes in all.
- tfrecord (5.35 GiB of 256 MiB shards): -68 and -103, flat (785 / 789 / 789 / 787): the
  stream holds less than the tiny set read whole. Writing 22-37 s, counting its 6.8
  million records (the first run's check, in the dry run) 345-381 s, the epoch 224 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process writes the TFRecords
GIB = 1024**3
MIB = 1024**2
CLASSES = 10
TEST_ROWS = 10_000
SHARD_BYTES = 256 * MIB
WRITE_ROWS = 65_536  # rows generated and written at a time
SAMPLE_S = 0.2
STATUS_KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


@dataclass
class Memory:
    """What the sampler saw of one child process, in bytes."""

    peak_rss: int = 0  # the highest VmRSS sampled
    rss: list[int] = field(default_factory=list)  # every VmRSS sampled, in order
    at_peak: dict[str, int] = field(default_factory=dict)  # the sample with that VmRSS
    hwm: int = 0  # the last VmHWM read (the kernel's running peak)
    seconds: float = 0.0
    returncode: int = 0
    output: str = ""

    @property
    def peak(self) -> int:
        return max(self.hwm, self.peak_rss)

    def quarters(self) -> str:
        """The median VmRSS of each quarter of the run: flat, or growing with what was read."""
        if len(self.rss) < 4:
            return "too few samples"
        size = len(self.rss) // 4
        parts = [sorted(self.rss[i * size : (i + 1) * size]) for i in range(4)]
        return " / ".join(f"{part[len(part) // 2] / MIB:,.0f}" for part in parts) + " MiB"


def read_status(pid: int) -> dict[str, int]:
    """The child's memory lines of /proc/PID/status, in bytes (empty once it has exited)."""
    found: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS and value.split():
            found[key] = int(value.split()[0]) * 1024  # kB
    return found


def measure(command: list[str], env: dict[str, str], cwd: Path) -> Memory:
    """Run `command`, sampling its memory every SAMPLE_S seconds until it exits."""
    memory = Memory()
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    stdout = process.stdout
    assert stdout is not None
    chunks: list[str] = []  # read beside the sampling, so a full pipe never stalls the child
    reader = threading.Thread(target=lambda: chunks.append(stdout.read()))
    reader.start()
    while process.poll() is None:
        status = read_status(process.pid)
        if status:  # an exited child's status has no memory lines
            memory.rss.append(status.get("VmRSS", 0))
            memory.hwm = max(memory.hwm, status.get("VmHWM", 0))
            if status.get("VmRSS", 0) > memory.peak_rss:
                memory.peak_rss, memory.at_peak = status["VmRSS"], status
        time.sleep(SAMPLE_S)
    reader.join()
    memory.seconds = time.monotonic() - started
    memory.returncode = process.returncode
    memory.output = "".join(chunks)
    return memory


def write_npy(folder: Path, rows: int, side: int, rng: np.random.Generator) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", rows), ("test", TEST_ROWS)):
        # Written in pieces, as np.save would write the whole array.
        with open(folder / f"x_{split}.npy", "wb") as out:
            np.lib.format.write_array_header_1_0(out, {
                "descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
                "fortran_order": False, "shape": (count, side, side),
            })
            for start in range(0, count, WRITE_ROWS):
                end = min(count, start + WRITE_ROWS)
                out.write(rng.integers(0, 256, (end - start, side, side), np.uint8).tobytes())
        np.save(folder / f"y_{split}.npy", rng.integers(0, CLASSES, count, np.uint8))


def write_tfrecords(folder: Path, rows: int, side: int, rng: np.random.Generator) -> None:
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    pixels = side * side
    (folder / "dataset.json").write_text(json.dumps({"shape": [side, side, 1],
                                                     "dtype": "uint8"}))

    def example(label: int) -> bytes:
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(pixels)])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)
                                ).SerializeToString()

    # One serialized Example, its image and label bytes replaced per record: protobuf in
    # Python per record would take minutes. Labels 0..9 are one-byte varints.
    template, other = bytearray(example(0)), example(1)
    label_at = next(i for i in range(len(template)) if template[i] != other[i])
    image_at = bytes(template).find(bytes(pixels))
    per_shard = max(1, SHARD_BYTES // (len(template) + 16))
    for split, count in (("train", rows), ("test", TEST_ROWS)):
        shards = -(-count // per_shard)
        for shard in range(shards):
            name = folder / f"data-{split}.tfrecord-{shard:05d}-of-{shards:05d}"
            first, last = shard * per_shard, min(count, (shard + 1) * per_shard)
            with tf.io.TFRecordWriter(str(name)) as out:
                for start in range(first, last, WRITE_ROWS):
                    end = min(last, start + WRITE_ROWS)
                    images = rng.integers(0, 256, (end - start, pixels), np.uint8)
                    labels = rng.integers(0, CLASSES, end - start)
                    for image, label in zip(images, labels, strict=True):
                        template[image_at : image_at + pixels] = image.tobytes()
                        template[label_at] = int(label)
                        out.write(bytes(template))


def train_env(dataset: str, output: Path, batch_size: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "MGPU_DEBUG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", GPUS="none", EPOCHS="1",
               QUIET="1", DATASET=dataset, OUTPUT_DIR=str(output), BATCH_SIZE=str(batch_size))
    return env


def summary_lines(output: str) -> list[str]:
    keys = ("dataset", "kept on each device", "batch", "error", "samples/s", "Trained")
    return [line.strip() for line in output.splitlines() if any(k in line for k in keys)]


def run_format(kind: str, root: Path, args: argparse.Namespace) -> dict[str, Memory]:
    """Write the tiny and the large data set of one format, train on each, then delete."""
    rng = np.random.default_rng(0)
    write = write_npy if kind == "npy" else write_tfrecords
    row_bytes = args.side * args.side
    rows = int(args.gib * GIB) // row_bytes
    results: dict[str, Memory] = {}
    for label, count in (("tiny", args.tiny_rows), ("large", rows)):
        folder = root / f"{kind}-{label}"
        started = time.monotonic()
        write(folder, count, args.side, rng)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{kind} {label}: {count:,} rows of {args.side}x{args.side} uint8, "
              f"{size / GIB:.2f} GiB on disk, written in {time.monotonic() - started:.0f} s",
              flush=True)
        command = [sys.executable, "-m", "entrypoint", "train"]
        dataset = f"{kind}:{folder}"
        # The cwd: the data sets' folder, where no .env is read.
        count_run = measure([*command, "--dry-run"], train_env(
            dataset, root / f"run-{kind}-{label}", args.batch_size), root)
        print(f"  counting (--dry-run): {count_run.seconds:.0f} s, peak RSS "
              f"{count_run.peak / MIB:,.0f} MiB, exit {count_run.returncode}", flush=True)
        for line in summary_lines(count_run.output):
            print(f"    {line}")
        memory = measure(command, train_env(dataset, root / f"run-{kind}-{label}",
                                            args.batch_size), root)
        results[label] = memory
        print(f"  training: {memory.seconds:.0f} s, exit {memory.returncode}, "
              f"{len(memory.rss)} samples; peak RSS {memory.peak / MIB:,.0f} MiB; at the "
              "highest sample: " + ", ".join(f"{k} {v / MIB:,.0f} MiB"
                                             for k, v in memory.at_peak.items()), flush=True)
        print(f"    median RSS by quarter of the run: {memory.quarters()}")
        if memory.returncode:
            print(memory.output[-3000:])
        else:
            found = json.loads((root / f"run-{kind}-{label}" / "metrics.json").read_text())
            print(f"    {found['train_samples_per_sec']:,.0f} samples/s in its epoch of "
                  f"{found['training_time_s']:.0f} s", flush=True)
        shutil.rmtree(root / f"run-{kind}-{label}", ignore_errors=True)
        if label == "large" and not args.keep:
            shutil.rmtree(folder)
    above = results["large"].peak - results["tiny"].peak
    verdict = "under" if above < args.target_gib * GIB else "OVER"
    print(f"{kind}: peak RSS {results['large'].peak / MIB:,.0f} MiB for {args.gib:g} GiB, "
          f"baseline {results['tiny'].peak / MIB:,.0f} MiB: {above / MIB:+,.0f} MiB above it, "
          f"{verdict} the {args.target_gib:g} GiB target\n", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("npy", "tfrecord", "both"), default="both")
    parser.add_argument("--gib", type=float, default=5.0, help="training images, GiB")
    parser.add_argument("--side", type=int, default=28, help="image height and width")
    parser.add_argument("--tiny-rows", type=int, default=None,
                        help="training rows of the baseline's data set (default: 1%% of a GiB)")
    parser.add_argument("--batch-size", type=int, default=256, help="per replica")
    parser.add_argument("--target-gib", type=float, default=1.5)
    parser.add_argument("--dir", type=Path, default=None, help="default: under /tmp")
    parser.add_argument("--keep", action="store_true", help="keep the data sets")
    args = parser.parse_args()
    args.tiny_rows = args.tiny_rows or GIB // 100 // (args.side * args.side)

    root = Path(tempfile.mkdtemp(prefix="mgpu-data-memory-", dir=args.dir))
    print(f"data sets under {root}; this process's peak RSS so far "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB", flush=True)
    try:
        for kind in (("npy", "tfrecord") if args.format == "both" else (args.format,)):
            run_format(kind, root, args)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
