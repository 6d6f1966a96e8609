"""mgpu-env: multi-GPU TensorFlow training with MirroredStrategy, and the checks around it.

The library behind the `mgpu` command. It never exits the process and never imports typer;
TensorFlow is imported only by the modules that need it, after GPU selection.
"""

__version__ = "0.1.0"
