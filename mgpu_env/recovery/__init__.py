"""Recovery of a supervised run, from its last checkpoint.

A restart after a crash or a stall, another all-reduce after a stall in the collectives,
and the GPUs that remain after one fails (`supervise`, `decide`, `health`).
"""

from mgpu_env.recovery.decide import Kept, RunDevices, Stop, keep_devices
from mgpu_env.recovery.supervise import Recovering, supervise_run

__all__ = ["Kept", "Recovering", "RunDevices", "Stop", "keep_devices", "supervise_run"]
