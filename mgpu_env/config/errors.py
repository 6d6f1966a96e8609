"""Errors the library raises for the user to read; the CLI maps them to exit codes."""

from __future__ import annotations


class MgpuError(Exception):
    """A failure with a message meant for the user (no traceback needed)."""

    exit_code = 1

    def user_message(self) -> str:
        """What the CLI prints: `error: ` and the message."""
        return f"error: {self}"


class ConfigError(MgpuError):
    """The configuration or the input cannot work: bad data file, missing data offline, ..."""

    exit_code = 2


class RunFailed(MgpuError):
    """The run started but could not finish (a check failed, a worker died, ...)."""

    exit_code = 1
