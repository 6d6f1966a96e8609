"""`mgpu run`: launching your own script with the settings applied.

- `script`: the target found, scanned, prepared (pre-flight, split, policy, the strategy's
  defaults) and run in this process, with mgpu's notes after it;
- `source_scan` (with `keras_3_breaks`): the script's source read before it starts, for what
  only Keras 2 has (KERAS=auto) and a custom loop;
- `strategy_watch`: each strategy the script builds, and the plan it is held against;
- `run_observer`: what the script's run did, seen where it happens (the strategy a step
  ran under, a DTensor mesh, the first gradient, each Keras layer's compute dtype, the
  calls that changed Keras' policy); `what_ran`: the lines after the script, from those;
- `run_watch`: the stall watch of the script's run (STALL_TIMEOUT), its phases read from
  the same kind of hooks.

This module only re-exports.
"""

from mgpu_env.launcher.run_watch import stall_watch
from mgpu_env.launcher.script import (
    SCRIPT_DECIDES,
    ScriptFailure,
    Target,
    keras_note,
    prepare,
    resolve_target,
    run_target,
    scan_target,
    summary,
)

__all__ = [
    "SCRIPT_DECIDES", "ScriptFailure", "Target", "keras_note", "prepare", "resolve_target",
    "run_target", "scan_target", "stall_watch", "summary",
]
