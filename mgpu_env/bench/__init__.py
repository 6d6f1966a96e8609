"""`mgpu bench` as a library: how training's speed scales with the replicas.

`mgpu bench`: the sweep (parent), the worker (one child process per point), statistics, models
and the plot."""
