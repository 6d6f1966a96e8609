"""The step's time as TensorFlow's profiler splits it.

Trace a few steps (`trace`), convert the trace with the profiler plugin's own converter
(`xprof`) to its overview page's step-time breakdown (`split`), and name the bottleneck with
its fix (`verdict`).

Nothing here is imported unless a command asks for a profile (`mgpu bench --explain`, `mgpu
train --profile STEPS`); `split` and `verdict` import neither TensorFlow nor xprof at import.
"""
