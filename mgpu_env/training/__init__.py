"""The packaged training: plan, loop, steps, signals, run folder, data, model, precision,
strategy and multi-worker. TensorFlow is imported inside functions, after GPU selection."""
