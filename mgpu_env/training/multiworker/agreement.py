"""The workers' agreement on their settings and values.

Before training the workers agree on their settings; after a restore every worker takes the
chief's values."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import Settings, with_role
from mgpu_env.runtime.strategy import WorkerRole

# Bytes per value in the agreement all-gather; longer values are compared by a digest.
VALUE_WIDTH = 48


# ---------------------------------------------------------------------------- agreement


def agreement_values(
    settings: Settings,
    chosen: Mapping[str, str],
    *,
    local_replicas: int,
    train_samples: int,
    steps_per_epoch: int,
) -> dict[str, str]:
    """What must be equal on every worker, as text keyed by the name the user knows: the
    settings declared with the role "agreed", and what the run derives from them.

    `chosen` holds what this worker resolved for a setting's request (DATASET `auto` to
    `digits`, MIXED_PRECISION `1` to `mixed_bfloat16`, KERAS `auto` to `2`): those are
    compared, so two workers that resolve `auto` differently are caught too. Equal local
    replicas keep the global batch (and the data shards) the same on every worker.
    """
    values = settings.as_text()
    return {
        **{env: chosen.get(env, values[env]) for env in with_role("agreed")},
        "local replicas (GPUs or VIRTUAL_DEVICES)": str(local_replicas),
        "training samples": str(train_samples),
        "steps per epoch": str(steps_per_epoch),
    }


def encode_values(values: Mapping[str, str], width: int = VALUE_WIDTH) -> list[int]:
    """The values (in key order) as fixed-width byte rows, for an integer all-gather."""
    import hashlib

    row: list[int] = []
    for key in sorted(values):
        data = values[key].encode("utf-8")
        if len(data) > width:
            data = data[: width - 17] + b"~" + hashlib.sha256(data).hexdigest()[:16].encode()
        row.extend(data + bytes(width - len(data)))
    return row


def decode_values(keys: Sequence[str], row: Sequence[int], width: int = VALUE_WIDTH) -> dict[
    str, str
]:
    ordered = sorted(keys)
    return {
        key: bytes(int(b) for b in row[i * width : (i + 1) * width]).rstrip(b"\0").decode(
            "utf-8", "replace"
        )
        for i, key in enumerate(ordered)
    }


def find_disagreements(
    keys: Sequence[str], rows: Mapping[int, Sequence[int]], names: Mapping[int, str]
) -> list[str]:
    """One line per worker whose values differ from the chief's (the first row's task)."""
    reference_id = min(rows)
    reference = decode_values(keys, rows[reference_id])
    lines = []
    for task_id in sorted(rows):
        if task_id == reference_id:
            continue
        theirs = decode_values(keys, rows[task_id])
        differing = [key for key in sorted(keys) if theirs[key] != reference[key]]
        if differing:
            details = ", ".join(
                f"{key}={theirs[key]} there but {reference[key]} on {names[reference_id]}"
                for key in differing
            )
            lines.append(f"{names[task_id]}: {details}")
    return lines


def check_agreement(strategy: Any, values: Mapping[str, str], role: WorkerRole) -> None:
    """All-gather every worker's `values`; raise ConfigError naming what differs.

    Collective: every worker must call it at the same point, right after the strategy is
    created and before any variable exists. Every worker raises, so all of them stop.
    """
    import numpy as np
    import tensorflow as tf

    position = role.task_id + (1 if role.task_type == "worker" and role._has_chief else 0)
    kind = 0 if role.task_type == "chief" else 1
    row = np.array([[position, kind, role.task_id, *encode_values(values)]], dtype=np.int32)
    mine = tf.constant(row)

    @tf.function
    def gather() -> Any:
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_gather(mine, axis=0)
        )

    gathered = strategy.experimental_local_results(gather())[0].numpy()
    # One row per replica; a worker with several replicas sends the same row several times.
    rows = {int(r[0]): [int(v) for v in r[3:]] for r in gathered}
    names = {
        int(r[0]): f"{'chief' if int(r[1]) == 0 else 'worker'} {int(r[2])}" for r in gathered
    }
    problems = find_disagreements(list(values), rows, names)
    if problems:
        raise ConfigError(
            "The workers' settings differ, so they cannot train together:\n  "
            + "\n  ".join(problems)
            + "\n  Fix: give every worker the same settings (the same .env or environment)."
        )


# ---------------------------------------------------------------------------- broadcast


def broadcast_from_chief(strategy: Any, variables: Sequence[Any], is_chief: bool) -> None:
    """Give every worker the chief's values of `variables` (one all-reduce each).

    Each replica contributes zeros except the chief's first one, which contributes the
    value, so the sum is the chief's value everywhere. Used after the chief restored a
    checkpoint: the other workers need not see the chief's folder at all. Every value
    travels as float64 (one dtype, so the all-reduce can pack them): exact for float32 and
    float16 values and for integers (the epoch, the optimizer's step) up to 2**53.
    """
    import tensorflow as tf

    variables = list(variables)

    @tf.function
    def reduce_all() -> Any:
        def replica_fn() -> list[Any]:
            context = tf.distribute.get_replica_context()
            source = tf.logical_and(
                tf.constant(is_chief), tf.equal(context.replica_id_in_sync_group, 0)
            )
            contributions = []
            for v in variables:
                value = tf.cast(tf.convert_to_tensor(v), tf.float64)
                contributions.append(tf.where(source, value, tf.zeros_like(value)))
            return context.all_reduce(tf.distribute.ReduceOp.SUM, contributions)

        return strategy.run(replica_fn)

    reduced = reduce_all()
    for v, value in zip(variables, reduced, strict=True):
        local = strategy.experimental_local_results(value)[0]
        v.assign(tf.cast(local, tf.as_dtype(v.dtype)))





def any_worker(strategy: Any) -> Callable[[Sequence[bool]], tuple[bool, ...]]:
    """flags -> each flag, true when it is true on any worker (one small all-reduce): a
    decision only one worker can see (a signal it received, its own clock's "a checkpoint
    is due") made by all at the same step, as a collective save needs. Traced once."""
    import tensorflow as tf

    @tf.function
    def reduce_all(local: Any) -> Any:
        def replica_fn() -> Any:
            context = tf.distribute.get_replica_context()
            # A copy made in the replica's context, on its device: the function's input
            # has none, and an all-reduce needs one ("destinations can not be empty").
            return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(local))

        return strategy.run(replica_fn)

    def agree(flags: Sequence[bool]) -> tuple[bool, ...]:
        local = tf.constant([1.0 if flag else 0.0 for flag in flags], tf.float32)
        summed = strategy.experimental_local_results(reduce_all(local))[0].numpy()
        return tuple(bool(value > 0) for value in summed)

    return agree
