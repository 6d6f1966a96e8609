"""Tests with a `gpu` test: they need a real GPU, and skip with the reason where NVML lists none."""
