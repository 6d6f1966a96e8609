"""mgpu-env: multi-GPU TensorFlow training with MirroredStrategy, and the checks around it.

The library behind the `mgpu` command, and a small API for your own training script
(`mgpu_env.api`): `strategy()`, `global_batch_size(per_replica)`, `num_replicas()`,
`is_chief()`, `run_dir()`. It never exits the process and never imports typer;
TensorFlow is imported only by the modules that need it, after GPU selection.
"""

__version__ = "0.1.0"

# `api.runtime()` is not re-exported: `mgpu_env.runtime` is the module that defines Runtime.
from mgpu_env.api import global_batch_size, is_chief, num_replicas, run_dir, strategy

__all__ = ["__version__", "global_batch_size", "is_chief", "num_replicas", "run_dir", "strategy"]
