"""mgpu's exit codes, declared once.

The CLI exits with them, the library's errors carry them, the local launcher's restart rule and
its workers' children read them, and docs/outputs.md's table documents exactly `DOCUMENTED`
(tests/unit/test_docs.py compares the two)."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1  # a check or the run failed (RunFailed, a lost worker)
EXIT_BAD_CONFIG = 2  # a bad setting, input or usage (ConfigError): a retry fails the same way
EXIT_STALLED = 3  # a phase of training made no progress within its bound (STALL_TIMEOUT)
# A process ended by signal N exits 128 + N, as a shell and Docker report it.
_SIGNAL_BASE = 128


def exit_for_signal(signum: int) -> int:
    """The exit code of a process that signal `signum` ended (143 for SIGTERM)."""
    return _SIGNAL_BASE + signum


# Every exit code docs/outputs.md's table lists, with its meaning in a few words.
DOCUMENTED: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_FAILED: "a check or the run failed",
    EXIT_BAD_CONFIG: "bad configuration or usage",
    EXIT_STALLED: "training stalled, resumable from the last checkpoint",
    exit_for_signal(signal.SIGTERM): "training stopped by SIGTERM, resumable",
    exit_for_signal(signal.SIGINT): "training stopped by Ctrl-C (SIGINT), resumable",
}
