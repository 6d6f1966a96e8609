"""The environment of a process a test starts: one builder for every child (`mgpu` as a
user's shell runs it, `mgpu train` end to end, the workers of a cluster, `mgpu run`), so
each drops the same variables the test process may carry and sees only what its test gives
it."""

from __future__ import annotations

import os
from pathlib import Path

from mgpu_env.config.settings import DECLARATIONS

REPO = Path(__file__).resolve().parents[2]

# What would change a child if it leaked from the test process: every setting (a child gets
# only those its test names), TensorFlow's and CUDA's device masks and log level, a cluster,
# the Keras choice and cache, mgpu's --debug switch, the colour switches.
DROPPED = frozenset({d.env for d in DECLARATIONS} | {
    "TF_CPP_MIN_LOG_LEVEL", "MGPU_DEBUG", "CUDA_VISIBLE_DEVICES", "TF_CONFIG",
    "TF_ENABLED_DEVICE_TYPES", "TF_USE_LEGACY_KERAS", "KERAS_HOME", "NO_COLOR", "FORCE_COLOR",
})


def child_env(home: Path, **settings: str) -> dict[str, str]:
    """The test process's environment without DROPPED, with this checkout importable, an
    empty HOME (an empty Keras cache) at `home`, and `settings` on top."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update(PYTHONPATH=str(REPO), HOME=str(home))
    env.update(settings)
    return env
