"""What the machine has, asked without importing TensorFlow.

What the machine has: NVML, the TensorFlow/CUDA compatibility table, GPU selection and device
splits, and the TensorFlow build probe. Nothing here imports TensorFlow at import time."""
