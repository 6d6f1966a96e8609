"""A real one-node Slurm for the slow Slurm tests and the Slurm benchmark.

`start_cluster()` runs `tests/slurm/start-slurm.sh` (which installs slurm-wlm and munge with
apt-get when root and missing, starts its own munged, slurmctld and slurmd, and waits until
the node is idle) and returns the cluster, or raises `SlurmUnavailable` with the reason
(not root, no apt-get, a daemon that would not start): the tests skip with it. A cluster
already running from that script is reused, and left running; one started here is stopped
by `SlurmCluster.stop()` (the test module's fixture does it at the end, so no daemon
outlives the tests; starting one takes well under a second once installed).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.children import REPO

START_SCRIPT = REPO / "tests" / "slurm" / "start-slurm.sh"
EXIT_CANNOT = 3
# Installing the packages (first use on a fresh machine) dominates; starting takes ~1 s.
START_TIMEOUT_S = 600


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why."""


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    started_here: bool
    start_seconds: float

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment for Slurm's commands: SLURM_CONF set, and no SLURM_*
        of a job the tests themselves may run in (it would describe another step)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SLURM_") and k not in ("TF_CONFIG", "MGPU_DEBUG")}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def run(self, *args: str, timeout: float = 30) -> str:
        """A Slurm command's stdout (scontrol, squeue, scancel, sbatch --parsable)."""
        done = subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_job(self, job_id: str, states: set[str], timeout_s: float) -> dict[str, str]:
        """Poll until the job is in one of `states`; the last record on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.job(job_id)
            if record.get("JobState") in states or time.monotonic() > deadline:
                return record
            time.sleep(0.5)

    def stop(self) -> None:
        if self.started_here:
            subprocess.run([str(START_SCRIPT), "stop"], check=False, capture_output=True,
                           timeout=60)


def start_cluster() -> SlurmCluster:
    """Start (or reuse) the one-node cluster; raise SlurmUnavailable with the reason."""
    was_running = subprocess.run([str(START_SCRIPT), "status"], capture_output=True,
                                 timeout=60, check=False).returncode == 0
    started = time.monotonic()
    try:
        done = subprocess.run([str(START_SCRIPT), "start"], capture_output=True, text=True,
                              timeout=START_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(
            f"{START_SCRIPT.name} did not finish in {START_TIMEOUT_S} s") from None
    seconds = time.monotonic() - started
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        raise SlurmUnavailable(reason or f"{START_SCRIPT.name} exited {done.returncode}")
    conf = Path(done.stdout.strip().splitlines()[-1])
    return SlurmCluster(conf, started_here=not was_running, start_seconds=seconds)
