"""Stopping a run on a record that cannot be read, naming its file.

A folder's records are checked when it is first counted (`data.files`); a later run trusts
the cached counts while the files keep their names, sizes and modification times, so a
file damaged in place is met mid-run, as a TensorFlow error that names no file. Under
`stop_on_bad_records` such an error has the files read again one at a time
(`data.verify.bad_records`): when one fails, the run stops as it does on a non-finite loss
(`epochs.raise_non_finite`): RunFailed (exit 1), nothing of the epoch saved, the last
completed epoch's checkpoint kept, and the message names the file, the record and the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mgpu_env.config.errors import RunFailed
from mgpu_env.training.input.data import Data, FileData
from mgpu_env.training.input.data.files import cache_path
from mgpu_env.training.input.data.verify import BadRecord, Split, bad_records
from mgpu_env.training.shared.messages import checkpoint_kept

# The bad files a message lists by name; more are counted.
LISTED = 3


def read_errors() -> tuple[type[Exception], ...]:
    """The TensorFlow errors a damaged file raises: a corrupt or truncated record
    (DataLossError), an image that does not decode or a label out of range
    (InvalidArgumentError), a file gone (NotFoundError). Others (out of memory, a lost
    worker) never send the run to re-read its files."""
    import tensorflow as tf

    return (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError)


@contextlib.contextmanager
def stop_on_bad_records(data: Data, splits: tuple[Split, ...], epoch: int | None, resume: str
                        ) -> Iterator[None]:
    """Turn a read error in the files of `data`'s `splits` into RunFailed naming them.
    `epoch`: the epoch being trained (0-based; None: the evaluation after the last);
    `resume`: the command that resumes the run. Any other error, or one no file explains,
    goes on up."""
    try:
        yield
    except read_errors() as err:
        if not isinstance(data, FileData):
            raise
        found = [bad for split in splits for bad in bad_records(data, split)]
        if not found:
            raise
        raise RunFailed(bad_records_message(data, found, epoch, resume)) from err


def bad_records_message(data: FileData, found: list[BadRecord], epoch: int | None,
                        resume: str) -> str:
    """The stop's message: the first bad record, the others, what was kept, cause and fix."""
    first, others = found[0], found[1:]
    more = ""
    if others:
        listed = ", ".join(bad.path for bad in others[:LISTED])
        unlisted = len(others) - LISTED
        more = f"\n  Also bad: {listed}" + (f" and {unlisted} more" if unlisted > 0 else "")
    if epoch is None:
        when = ("in the evaluation after the last epoch: every epoch is checkpointed; the "
                "model and metrics.json were not written")
    else:
        when = (f"in epoch {epoch + 1}: training stopped and nothing of this epoch was saved; "
                f"{checkpoint_kept(epoch)}")
    return (
        f"{first.describe()}, met {when}.{more}\n"
        f"  Cause: the file changed after DATASET={data.name} was counted and checked, keeping "
        f"its name, size and modification time (the key of the counts cached in "
        f"{cache_path(data.folder)}): a damaged disk or copy.\n"
        f"  Fix: replace or regenerate the file (or remove it; a changed folder is counted and "
        f"checked again), then resume with: {resume}"
    )
