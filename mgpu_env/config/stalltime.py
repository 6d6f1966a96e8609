"""STALL_TIMEOUT's value: how long a phase of a run may go without progress.

Past it the run is called stalled (`mgpu_env.training.multiworker.stall`). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mgpu_env.config.text import SettingError, decimal_number, shown

# A time as CHECKPOINT_EVERY writes one: seconds, minutes or hours.
_UNITS = {"s": 1, "m": 60, "h": 3600}
# Under a second no phase can be told from a stall; past a week a unit was mistyped.
_FEWEST_SECONDS = 1.0
_MOST_SECONDS = 7 * 86_400.0


@dataclass(frozen=True)
class StallTimeout:
    """`auto` (`seconds` None): each phase's bound from this machine's measurements; `0`
    (`seconds` 0): no watchdog; else every phase's bound in seconds. `str()` gives the
    setting's text back."""

    seconds: float | None = None

    @property
    def auto(self) -> bool:
        return self.seconds is None

    @property
    def off(self) -> bool:
        return self.seconds == 0

    def __str__(self) -> str:
        if self.seconds is None:
            return "auto"
        if not self.seconds:
            return "0"
        for unit, size in (("h", 3600), ("m", 60)):
            if self.seconds % size == 0:
                return f"{int(self.seconds // size)}{unit}"
        return f"{self.seconds:g}s"


def parse_stall_timeout(text: str) -> StallTimeout:
    """`auto`; `0` or `off`; a number of seconds (`600`) or a time (`90s`, `10m`, `1.5h`)
    from 1 s to a week."""
    lowered = text.strip().lower()
    if lowered == "auto":
        return StallTimeout()
    if lowered in ("0", "off"):
        return StallTimeout(0.0)
    unit = _UNITS.get(lowered[-1:], 0) if lowered else 0
    number = decimal_number(lowered[:-1] if unit else lowered)
    if number is None:
        raise SettingError(f"{shown(text.strip())} is neither auto, 0 nor a time")
    seconds = number * (unit or 1)
    if not (math.isfinite(seconds) and _FEWEST_SECONDS <= seconds <= _MOST_SECONDS):
        raise SettingError("a time must be at least 1s and at most 168h (a week)")
    return StallTimeout(seconds)
