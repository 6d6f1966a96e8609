"""`mgpu train --max-restarts K` in one process, under a supervisor that restarts it.

The run is a child of a small supervisor
(`runtime.cluster.local.supervise`, the machinery `--workers` uses: its signals pass
through, it is killed with the supervisor, its exit codes follow the same rules), restarted
from its last checkpoint after a crash or a stall (exit 3), up to K times.

Before each restart the supervisor looks at what ended the attempt (`decide`): a stall in
the collectives with CROSS_DEVICE_OPS=auto moves to the next all-reduce; a GPU the doctor's
health check fails, or that the error named, is left out and the run goes on with the
rest at the same global batch (the per-replica batch adapts; the resume rules accept a
change of replicas that keeps the global batch). Each change is said in the log as it is
made, in the last lines, and in metrics.json's "recovery" list.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.exitcodes import EXIT_STALLED
from mgpu_env.recovery.decide import (
    Kept,
    RunDevices,
    all_reduce_after,
    gpu_named,
    keep_devices,
    stalled_phase,
)
from mgpu_env.recovery.health import failing_gpus
from mgpu_env.runtime.cluster.local import Ended, Supervised, Supervision, supervise
from mgpu_env.training.run import rundir
from mgpu_env.training.run.state import check_run_state
from mgpu_env.training.shared.atomic import atomic_write_json

RECOVERY_KEY = "recovery"  # metrics.json's list of what the supervisor changed


@dataclass(frozen=True)
class OneRun:
    """One supervised `mgpu train`: its environment on top of the supervisor's."""

    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return 1

    def environment(self, index: int) -> dict[str, str]:
        return dict(self.env)

    def name(self, index: int) -> str:
        return "the run"

    def tag(self, index: int) -> str:
        return ""  # its lines are the run's own

    def renewed(self, ports: Callable[[int], list[int]]) -> OneRun:
        return self


@dataclass
class Recovering:
    """The supervisor's view of the run across attempts: its devices and all-reduce now,
    CROSS_DEVICE_OPS as the user asked it, and what was changed (`events`)."""

    folder: Path
    devices: RunDevices
    all_reduce: str
    requested_all_reduce: str
    min_gpus: int
    say: Callable[[str], None]
    max_restarts: int = 0  # MAX_RESTARTS: how many attempts after the first
    events: list[dict[str, Any]] = field(default_factory=list)
    attempt: int = 0

    def __call__(self, ended: Ended, plan: Supervised) -> Supervised | None:
        self.attempt += 1
        env = dict(plan.environment(0))
        phase = stalled_phase(ended.last_lines) if ended.code == EXIT_STALLED else None
        when = {"attempt": self.attempt, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime()),
                "resumes_from": self._resumes_from(),
                "cause": f"exit {ended.code}" + (f", stalled in {phase}" if phase else "")}
        failing = self._failing(ended.last_lines)
        if failing:
            kept = keep_devices(self.devices, failing, self.min_gpus)
            if not isinstance(kept, Kept):
                self.say(kept.message)
                self.events.append({**when, "action": "stopped", "why": kept.message})
                return None
            self._narrow(kept, when)
            env.update(kept.devices.environment())
        nxt = all_reduce_after(self.requested_all_reduce, self.all_reduce, phase,
                               self.devices.replicas)
        if nxt is not None:
            self.say(f"the run stalled in {phase} with the {self.all_reduce} all-reduce: "
                     f"restarting with {nxt} (CROSS_DEVICE_OPS=auto's next that works here)")
            self.events.append({**when, "action": "all_reduce", "from": self.all_reduce,
                                "to": nxt})
            self.all_reduce = nxt
            env["CROSS_DEVICE_OPS"] = nxt
        # The workers of `--workers N` are restarted as they were (their launcher owns them).
        return replace(plan, env=env) if isinstance(plan, OneRun) else plan

    def _failing(self, lines: Sequence[str]) -> dict[int, str]:
        """The run's GPUs to leave out: the doctor's health check on each, then a GPU the
        error named by TensorFlow's device name."""
        used = self.devices.gpus
        if not used:
            return {}
        failing = failing_gpus(used)
        named = gpu_named(lines, used)
        if named is not None and named not in failing:
            failing[named] = "the run's error named it"
        return failing

    def _narrow(self, kept: Kept, when: dict[str, Any]) -> None:
        before = self.devices
        after = kept.devices
        for gpu, why in kept.dropped.items():
            self.say(f"GPU {gpu} left out ({why}): going on with GPU(s) "
                     f"{', '.join(map(str, after.gpus))}, {after.replicas} replica(s) of "
                     f"{after.global_batch // after.replicas} (global batch "
                     f"{after.global_batch} kept), from {when['resumes_from']}")
        if kept.idle:
            self.say(f"GPU(s) {', '.join(map(str, kept.idle))} healthy but unused: "
                     f"{before.global_batch} rows do not split evenly over more replicas")
        self.events.append({
            **when, "action": "gpus_dropped",
            "dropped": {str(g): why for g, why in kept.dropped.items()},
            "gpus_from": list(before.gpus), "gpus_to": list(after.gpus),
            "replicas_from": before.replicas, "replicas_to": after.replicas,
            "global_batch": after.global_batch,
            "per_replica_batch_from": before.global_batch // before.replicas,
            "per_replica_batch_to": after.global_batch // after.replicas,
            **({"idle": list(kept.idle)} if kept.idle else {}),
        })
        self.devices = after

    def _resumes_from(self) -> str:
        if not self.folder.is_dir():
            return "the start"
        try:
            position = check_run_state(self.folder).position
        except (ConfigError, OSError):  # damaged: the restarted run says how, with the fix
            return "the last checkpoint"
        return (f"epoch {position.epoch + 1}, step {position.step}" if position.step
                else f"the end of epoch {position.epoch}" if position.epoch else "the start")

    def end_lines(self) -> list[str]:
        """The last lines: each change the supervisor made, one a line."""
        lines = []
        for event in self.events:
            if event["action"] == "gpus_dropped":
                dropped = ", ".join(f"GPU {g} ({why})" for g, why in event["dropped"].items())
                lines.append(f"recovered: left out {dropped} at {event['at']}, from "
                             f"{event['resumes_from']}; {event['replicas_from']} -> "
                             f"{event['replicas_to']} replicas, global batch "
                             f"{event['global_batch']} kept")
            elif event["action"] == "all_reduce":
                lines.append(f"recovered: all-reduce {event['from']} -> {event['to']} after "
                             f"a stall ({event['cause']}) at {event['at']}")
        return lines

    def record(self) -> None:
        """metrics.json's "recovery": what was changed, when and why (when it exists)."""
        path = self.folder / rundir.METRICS_FILE
        if not self.events or not path.is_file():
            return
        metrics = rundir.read_json(path) or {}
        atomic_write_json(path, {**metrics, RECOVERY_KEY: self.events})


def supervise_run(command: Sequence[str], environ: Mapping[str, str], recovering: Recovering,
                  *, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run `command` (an `mgpu train`) under supervision with up to
    `recovering.max_restarts` restarts; return its exit code by `local.supervise`'s rules.
    The child trains without a supervisor of its own (MAX_RESTARTS=0) in the folder
    decided here (OUTPUT_DIR)."""
    env = {**environ, "MAX_RESTARTS": "0", "OUTPUT_DIR": str(recovering.folder)}
    code = supervise(OneRun(), command, env, Supervision(
        max_restarts=recovering.max_restarts, stdout=stdout, stderr=stderr,
        recovery=recovering))
    recovering.record()
    for line in recovering.end_lines():
        recovering.say(line)
    return code
