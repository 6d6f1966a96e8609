""""Nothing to do": a start whose run folder already holds this run, finished.

It is answered from the folder's files alone, before TensorFlow is imported (that import alone
takes seconds).

Only the case that is certain takes this path: one process, the same run (run.json's
identity equals this start's), metrics.json saying it finished EPOCHS epochs, and the
latest checkpoint of that epoch. Anything else (another EPOCHS, another identity, a
multi-worker cluster, a file that cannot be read) goes the usual way, which trains,
resumes or refuses with its own message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.runtime import Runtime
from mgpu_env.training.run import rundir
from mgpu_env.training.run.identity import RunIdentity, identify


@dataclass(frozen=True)
class FinishedRun:
    """A finished run found in OUTPUT_DIR: where, when it finished, and its results."""

    output_dir: Path
    finished_at: float  # when metrics.json was written (seconds since the epoch)
    metrics: dict[str, Any]

    def message(self) -> str:
        """What `mgpu train` says instead of training: which run, finished when, and the
        two ways to train more."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.finished_at))
        epochs = int(self.metrics.get("epochs_completed", 0))
        accuracy = self.metrics.get("test_accuracy")
        result = f", test accuracy {float(accuracy):.4f}" if accuracy is not None else ""
        return (
            f"Nothing to do: {self.output_dir} holds this run, finished at {stamp} after "
            f"{epochs} epoch{'' if epochs == 1 else 's'}{result} (its metrics.json).\n"
            f"  To train it longer: EPOCHS={epochs + 1} or more, same OUTPUT_DIR; to train "
            "anew: another OUTPUT_DIR or RUN_NAME."
        )


def read_finished(output_dir: Path) -> FinishedRun | None:
    """The finished run whose metrics.json is in `output_dir`, or None."""
    try:
        metrics = rundir.read_json(output_dir / rundir.METRICS_FILE)
        finished_at = (output_dir / rundir.METRICS_FILE).stat().st_mtime
    except (ConfigError, OSError):
        return None
    if not metrics or metrics.get("status") != "finished":
        return None
    return FinishedRun(output_dir, finished_at, metrics)


def finished_in(start: RunIdentity, epochs: int) -> FinishedRun | None:
    """The run `start` names, finished already with `epochs` epochs, from its folder's files;
    None whenever that is not certain (the usual path then decides): metrics.json says it
    finished `epochs` epochs, the latest checkpoint is of that epoch, and run.json's
    identity is this start's. The one test of "already finished"; imports no TensorFlow."""
    finished = read_finished(start.output_dir)
    if finished is None or not rundir.finished_as_asked(finished.metrics, epochs):
        return None
    try:
        if rundir.latest_checkpoint_epoch(start.output_dir) != epochs:
            return None
        stored = rundir.read_json(start.output_dir / rundir.RUN_FILE)
    except ConfigError:
        return None
    identity = stored.get("identity") if stored else None
    if not isinstance(identity, dict) or rundir.identity_differences(identity, start.values):
        return None
    return finished


def finished_run(runtime: Runtime) -> FinishedRun | None:
    """This start's run, finished already, for one process (a cluster goes on: the chief's
    state decides for every worker); None whenever that is not certain."""
    if runtime.strategy_plan.role.num_workers != 1:
        return None
    return finished_in(identify(runtime), runtime.settings.epochs)
