"""`mgpu bench`: being built (see the issue tracker)."""

from __future__ import annotations

from entrypoint.options import EXIT_FAILED, SettingFlags, fail, with_settings


@with_settings()
def command(flags: SettingFlags) -> None:
    """Not built yet."""
    fail("mgpu bench is not built yet", EXIT_FAILED)
