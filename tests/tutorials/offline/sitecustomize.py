"""Lets the tutorials' `tf.keras.datasets.mnist.load_data()` run offline, on a small
stand-in for MNIST that the test writes where Keras caches it (~/.keras/datasets/mnist.npz).

Keras (tf_keras and Keras 3 alike) accepts a cached file only when its SHA-256 is the real
MNIST's, and otherwise downloads it again, which cannot work here. The tests put this folder
on PYTHONPATH, so Python imports this module at start-up; it changes one thing: the file
named by TUTORIAL_MNIST passes Keras' hash check. Every other file is checked as before, and
nothing is imported early (the patch is applied when Keras imports its own module).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# Where each Keras defines the `validate_file` its `get_file` calls.
CHECKERS = ("tf_keras.src.utils.data_utils", "keras.src.utils.file_utils")


def _accept_the_stand_in(module: ModuleType) -> None:
    original = module.validate_file
    stand_in = os.path.realpath(os.environ["TUTORIAL_MNIST"])

    def validate_file(fpath: str, *args: Any, **kwargs: Any) -> bool:
        if os.path.realpath(fpath) == stand_in:
            return True
        return bool(original(fpath, *args, **kwargs))

    module.validate_file = validate_file


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in CHECKERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _accept_the_stand_in(module)

        loader.exec_module = exec_module
        return spec


if os.environ.get("TUTORIAL_MNIST"):
    sys.meta_path.insert(0, _PatchOnImport())
