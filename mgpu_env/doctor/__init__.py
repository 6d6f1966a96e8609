"""`mgpu doctor` as a library: gather facts, judge them, return the diagnosis as data.

    diagnosis = diagnose(resolved, os.environ)           # NVML + host + TensorFlow (child)
    diagnosis.errors, diagnosis.warnings, diagnosis.to_dict()  # the CLI renders and picks the code

- `facts`: the probes and the typed record they fill;
- `checks`: pure judgements, each registered once with `@check` in its topic module;
- `diagnosis`: `gather` (every probe once) and `diagnose` (judge; `smoke=True` also runs
  `smoke`: a real all-reduce, an XLA function and a matmul with the runtime's own decisions,
  in a child process with a timeout);
- `verdict`: `Diagnosis`, the one-line verdict and the JSON layout;
- `gate`: `preflight` and `require_ready`, the cheap subset `mgpu train` and `mgpu run` run
  before they start;
- `report`: `--report`'s bug report.

This module only re-exports.
"""

from __future__ import annotations

from mgpu_env.doctor.checks import Check, SkippedGroup, Status
from mgpu_env.doctor.diagnosis import diagnose, gather
from mgpu_env.doctor.facts import Facts
from mgpu_env.doctor.gate import preflight, require_ready
from mgpu_env.doctor.smoke import SmokeResult
from mgpu_env.doctor.verdict import SCHEMA_VERSION, Diagnosis, unusable_settings

__all__ = [
    "SCHEMA_VERSION",
    "Check",
    "Diagnosis",
    "Facts",
    "SkippedGroup",
    "SmokeResult",
    "Status",
    "diagnose",
    "gather",
    "preflight",
    "require_ready",
    "unusable_settings",
]
