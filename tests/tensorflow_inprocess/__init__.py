"""Tests that run TensorFlow in the test process, on the CPU split into logical devices
(the `logical_cpus` fixture)."""
