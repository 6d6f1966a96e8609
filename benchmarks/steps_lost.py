"""Training steps a stop throws away: `kill -9` and SIGTERM at a random moment of `mgpu train`.

    .venv/bin/python benchmarks/steps_lost.py [--trials 5] [--seed 0] [--epochs 8]
        [--dataset synthetic] [--batch-size 32] [--window-epochs 3] [--signals kill,term]
        [--checkpoint-every 1s]

Each trial starts `mgpu train` in a fresh run folder, waits for its second epoch to end (the
steady state: TensorFlow started, the step traced), then waits a random time, uniform over
the next `--window-epochs` epochs (the second epoch's time each; seeded: `--seed` gives the
same moments), and sends the signal. A trial whose run had finished training by then is
left out and said so.

steps lost = steps trained when the signal came - steps held by the newest checkpoint (the
one a resume starts from, read once the process has exited):
- steps trained: the completed epochs (history.json) x steps_per_epoch, plus the current
  epoch's: the time since it started x the run's steady step rate, at most an epoch. The
  script watches history.json to know when each epoch ended; an epoch started its
  `seconds` (history.json) before it ended, and the next one the median gap later (the
  checkpoint save and the other epoch-end work). For SIGTERM it is a lower bound: the run
  trains on to its next step boundary, and those steps are lost too.
- steps held: `checkpointed_steps` (`ckpt-E`: E whole epochs; `ckpt-E-S`: S steps more).
Also printed: the seconds of training those steps took. Per signal: the mean, median and
max, and the mean as a fraction of an epoch. Settings: GPUS=none, QUIET=1; the checkpoint
interval is mgpu train's default (CHECKPOINT_EVERY=10m: at the seconds-long epochs here,
only the epochs' ends and the stops' own saves), or `--checkpoint-every` (e.g. `1s`, the
same interval relative to these epochs as 10m to an epoch of an hour).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


@dataclass(frozen=True)
class Trial:
    signal_name: str
    delay_s: float  # after the second epoch's end
    epochs_done: int  # completed epochs in history.json at the end
    steps_trained: float  # when the signal came
    steps_saved: int  # in the newest checkpoint
    rate: float  # steps per second, steady
    steps_per_epoch: int
    exit_code: int

    @property
    def steps_lost(self) -> float:
        return max(0.0, self.steps_trained - self.steps_saved)

    @property
    def seconds_lost(self) -> float:
        return self.steps_lost / self.rate


def train_command() -> list[str]:
    return [sys.executable, "-m", "entrypoint", "train"]


def environment(args: argparse.Namespace, output_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "WORKER_HOSTS", "WORKER_INDEX", "MGPU_DEBUG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", GPUS="none", QUIET="1",
               DATASET=args.dataset, BATCH_SIZE=str(args.batch_size),
               EPOCHS=str(args.epochs), OUTPUT_DIR=str(output_dir))
    if args.checkpoint_every:
        env["CHECKPOINT_EVERY"] = args.checkpoint_every
    return env


def steps_per_epoch(args: argparse.Namespace, work: Path) -> int:
    """From the plan mgpu train would run (`--dry-run --json`: no TensorFlow, no training)."""
    planned = subprocess.run([*train_command(), "--dry-run", "--json"], cwd=work,
                             env=environment(args, work / "plan"), capture_output=True,
                             text=True, check=True, timeout=300)
    return int(json.loads(planned.stdout)["steps_per_epoch"])


def history(output_dir: Path) -> list[dict[str, float]]:
    try:
        return list(json.loads((output_dir / "history.json").read_text())["epochs"])
    except (OSError, ValueError, KeyError):
        return []  # not written yet


def checkpointed_steps(output_dir: Path, per_epoch: int) -> int:
    """The steps the newest checkpoint holds, as a resume reads it from the checkpoint
    index: `ckpt-E` is E completed epochs, `ckpt-E-S` S steps more (CHECKPOINT_EVERY)."""
    try:
        index = (output_dir / "checkpoints" / "checkpoint").read_text()
    except OSError:
        return 0
    found = re.search(r'^model_checkpoint_path: "ckpt-(\d+)(?:-(\d+))?"', index, re.M)
    return int(found.group(1)) * per_epoch + int(found.group(2) or 0) if found else 0


@dataclass
class Watch:
    """When each epoch ended, as seen by polling history.json (every 10 ms)."""

    output_dir: Path
    ends: list[float] = field(default_factory=list)

    def look(self) -> list[dict[str, float]]:
        epochs = history(self.output_dir)
        while len(self.ends) < len(epochs):
            self.ends.append(time.time())
        return epochs

    def until(self, moment: float, process: subprocess.Popen[bytes]) -> None:
        while time.time() < moment and process.poll() is None:
            self.look()
            time.sleep(0.01)

    def steps_at(self, when: float, epochs: list[dict[str, float]], per_epoch: int,
                 rate: float) -> float:
        """Steps trained at `when`: the completed epochs, and the current one's share."""
        seen = min(len(self.ends), len(epochs))
        starts = [self.ends[k] - float(epochs[k]["seconds"]) for k in range(seen)]
        # The gap after the first epoch holds the first save (slower): used only alone.
        gaps = [starts[k + 1] - self.ends[k] for k in range(seen - 1)]
        gap = statistics.median(gaps[1:] or gaps) if gaps else 0.0
        done = [end for end in self.ends[:seen] if end <= when]
        current = max(0.0, when - (done[-1] + gap)) * rate if done else 0.0
        return len(done) * per_epoch + min(float(per_epoch), current)


def trial(args: argparse.Namespace, work: Path, index: int, name: str, rng: random.Random,
          per_epoch: int) -> Trial | None:
    """One run, stopped by signal `name` at a random moment; None when it ended first."""
    output_dir = work / f"run{index}-{name}"
    log = (work / f"run{index}-{name}.log").open("w")
    process = subprocess.Popen(train_command(), cwd=work, env=environment(args, output_dir),
                               stdout=log, stderr=subprocess.STDOUT)
    watch = Watch(output_dir)
    try:
        while len(done := watch.look()) < 2:
            if process.poll() is not None:
                raise SystemExit(f"mgpu train exited {process.returncode} before its second "
                                 f"epoch ended; see {log.name}")
            time.sleep(0.01)
        delay = rng.uniform(0.0, args.window_epochs * float(done[1]["seconds"]))
        watch.until(watch.ends[1] + delay, process)
        if process.poll() is not None:
            return None
        signalled = time.time()
        process.send_signal(SIGNALS[name])
        code = process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
    epochs = history(output_dir)
    if len(epochs) == args.epochs:
        return None  # it had finished training: the signal fell in its evaluation or save
    rate = per_epoch / statistics.median(float(e["seconds"]) for e in epochs[1:])
    return Trial(name, delay, len(epochs), watch.steps_at(signalled, epochs, per_epoch, rate),
                 checkpointed_steps(output_dir, per_epoch), rate, per_epoch,
                 128 - code if code < 0 else code)


def report(trials: list[Trial]) -> None:
    for name in sorted({t.signal_name for t in trials}):
        chosen = [t for t in trials if t.signal_name == name]
        steps = [t.steps_lost for t in chosen]
        seconds = [t.seconds_lost for t in chosen]
        per_epoch = chosen[0].steps_per_epoch
        print(f"{name:>4}: {len(chosen)} trials; steps lost mean {statistics.mean(steps):.0f}, "
              f"median {statistics.median(steps):.0f}, max {max(steps):.0f} "
              f"(mean {statistics.mean(steps) / per_epoch:.2f} of an epoch of {per_epoch}); "
              f"seconds lost mean {statistics.mean(seconds):.2f}, max {max(seconds):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per signal")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random moments")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window-epochs", type=float, default=3.0,
                        help="the random moment falls within this many epochs after the second")
    parser.add_argument("--signals", default="kill,term", help="kill, term, or both")
    parser.add_argument("--checkpoint-every", default="",
                        help="CHECKPOINT_EVERY for the runs (default: mgpu train's own)")
    args = parser.parse_args()
    names = [n.strip() for n in args.signals.split(",") if n.strip()]
    if not names or set(names) - set(SIGNALS):
        parser.error(f"--signals {args.signals!r}: valid are kill, term, or kill,term")
    if args.window_epochs > args.epochs - 3:
        parser.error(f"--window-epochs {args.window_epochs} must be at most --epochs - 3 "
                     f"({args.epochs - 3}): the run must still be training at the moment")
    rng = random.Random(args.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the `finally`s stop the runs
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="steps-lost-") as tmp:
        work = Path(tmp)
        per_epoch = steps_per_epoch(args, work)
        for index in range(args.trials):
            for name in names:  # alternated, so a change in the machine's load hits both
                done = trial(args, work, index, name, rng, per_epoch)
                if done is None:
                    print(f"trial {index} {name}: the run had finished training before the "
                          "signal; left out (raise --epochs)")
                    continue
                trials.append(done)
                print(f"trial {index} {name:>4}: signal {done.delay_s:5.2f} s after epoch 2, "
                      f"exit {done.exit_code}, {done.steps_trained:6.0f} steps trained, "
                      f"{done.steps_saved} checkpointed: lost {done.steps_lost:5.0f} steps "
                      f"= {done.seconds_lost:5.2f} s", flush=True)
    if trials:
        report(trials)


if __name__ == "__main__":
    main()
