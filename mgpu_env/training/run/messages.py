"""The message pieces, under their old path (they moved below the training folders, to
`training.shared.messages`, so input/ need not import run/)."""

from mgpu_env.training.shared.messages import (
    FILE_KIND_NOUNS,
    checkpoint_kept,
    npy_problem,
    plural,
    tensorflow_message,
    unwritable_folder,
)

__all__ = ["FILE_KIND_NOUNS", "checkpoint_kept", "npy_problem", "plural", "tensorflow_message",
           "unwritable_folder"]
