"""The errors the library raises for the user to read.

The CLI maps each to its exit code."""

from __future__ import annotations

from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_FAILED


class MgpuError(Exception):
    """A failure with a message meant for the user (no traceback needed)."""

    exit_code = EXIT_FAILED

    def user_message(self) -> str:
        """What the CLI prints: `error: ` and the message."""
        return f"error: {self}"


class ConfigError(MgpuError):
    """The configuration or the input cannot work: bad data file, missing data offline, ..."""

    exit_code = EXIT_BAD_CONFIG


class RunFailed(MgpuError):
    """The run started but could not finish (a check failed, a worker died, ...)."""

    exit_code = EXIT_FAILED
