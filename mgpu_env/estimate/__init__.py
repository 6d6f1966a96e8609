"""Estimates made before (or beside) a measurement, from sizes alone.

Estimates made before (or beside) a measurement: the all-reduce's time per step from the
gradient's bytes and the bus bandwidth (`allreduce`), and each device's memory for a model and
a batch (`memory`). Pure arithmetic on sizes; TensorFlow only where a model is read."""
