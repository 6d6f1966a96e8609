"""`mgpu bench`: the sweep (parent), the worker (one child process per point), statistics,
models and the plot."""
