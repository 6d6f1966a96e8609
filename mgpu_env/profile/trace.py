"""A few steps traced by TensorFlow's profiler, where TensorBoard reads them.

A few steps traced by TensorFlow's profiler (`tf.profiler.experimental`), each inside a step
marker the profiler's converter finds (`Trace("train", step_num=..., _r=1)`, as Keras'
TensorBoard callback marks its steps), written where TensorBoard's Profile tab reads it:
`<logdir>/plugins/profile/<time>/<host>.xplane.pb`.

Each step must be one call with no `tf.while_loop` inside: the profiler's event grouping
gives up on a trace that holds loop ops (`tf.range` in a `tf.function`), and its converter
then finds no step at all ("No step marker observed"). The training loops run many steps
per call in such a loop, so the profiled steps call the same replica step once per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgpu_env.profile.split import StepSplit, convert, xspace_files

# One more step each side: the converter drops a first or last step it finds incomplete
# (its `maybe_drop_incomplete_steps`), and the profiler's start and stop touch them; the
# split is of the steps in between (`StepSplit.middle`).
EDGE_STEPS = 2


def trace_steps(logdir: Path, step: Callable[[], Any], steps: int) -> list[Path]:
    """Run `step` `steps` + EDGE_STEPS times under the profiler into `logdir`; return the
    session's XSpace files. `step` must return once its work is done (read a value to the
    host), so that the work falls inside its marker."""
    import tensorflow as tf

    logdir.mkdir(parents=True, exist_ok=True)
    before = set(xspace_files(logdir))
    tf.profiler.experimental.start(str(logdir))
    try:
        for number in range(steps + EDGE_STEPS):
            with tf.profiler.experimental.Trace("train", step_num=number, _r=1):
                step()
    finally:
        tf.profiler.experimental.stop()
    # Sessions are named by the second they start: wait out a second before the next one,
    # so two profiles in one folder never share (and overwrite) a session.
    time.sleep(max(0.0, 1.0 - (time.time() % 1.0)))
    files = xspace_files(logdir)
    return files if set(files) != before else []


def profile_split(logdir: Path, step: Callable[[], Any], steps: int) -> StepSplit:
    """`trace_steps`, then the profile plugin's split of those steps (`split.convert`): the
    `steps` in the middle."""
    return convert(trace_steps(logdir, step, steps)).middle(steps)
