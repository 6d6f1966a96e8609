"""Which run a start of `mgpu train` is.

That is its folder, its data set, its global batch and what must match for the folder's run
to be resumed. Decided once, first (`identify`), from the applied runtime alone: filesystem
only, no TensorFlow, no network, no user code. The "nothing to do" answer
(`finished.finished_in`) and the plan (`plan.plan_training`) both take it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.settings import DECLARATIONS, Settings
from mgpu_env.runtime import Runtime
from mgpu_env.training.input.data import DatasetChoice, resolve_dataset
from mgpu_env.training.run import rundir


@dataclass(frozen=True)
class RunIdentity:
    """This start's run: where it is, which data set it trains on, its global batch, and
    run.json's identity (`values`)."""

    output_dir: Path
    dataset: DatasetChoice
    global_batch_size: int
    values: dict[str, Any]


def identify(runtime: Runtime, environ: Mapping[str, str] | None = None) -> RunIdentity:
    """The run this start is: the run folder `resolve_run_settings` decided, the data set
    (`resolve_dataset`, once per start: DATASET was checked when it was parsed), the global
    batch (BATCH_SIZE on every replica) and the identity built from them."""
    settings = runtime.settings
    dataset = resolve_dataset(settings.dataset, settings.data_dir,
                              os.environ if environ is None else environ)
    global_batch = runtime.global_batch_size
    return RunIdentity(
        output_dir=rundir.run_folder(settings), dataset=dataset,
        global_batch_size=global_batch,
        values=run_identity(settings, dataset.name, runtime.precision.policy, global_batch),
    )


def run_identity(
    settings: Settings, dataset: str, policy: str, global_batch_size: int
) -> dict[str, Any]:
    """What must match for a run folder to be resumed (EPOCHS may grow, devices may not):
    the settings declared with the role "identity", with what the run chose for `auto`
    (the data set, the precision policy), and the global batch."""
    chosen: dict[str, Any] = {"DATASET": dataset, "MIXED_PRECISION": policy}
    identity: dict[str, Any] = {"global_batch_size": global_batch_size}
    for declaration in DECLARATIONS:
        if "identity" not in declaration.roles:
            continue
        value = getattr(settings, declaration.field_name)
        if declaration.identity_if_set and value == declaration.parse(declaration.default):
            continue
        identity[declaration.identity] = chosen.get(declaration.env, value)
    return identity
