"""mgpu under a real Slurm (one node, `tests/support/slurm_cluster.py`): srun steps, a batch job.

Each `srun -n2` step is one 2-worker run on this machine's CPU: the tasks read their rank
and the step's nodes from Slurm's variables, nothing else. Each task writes its own log
(`srun --output=task-%t.log`). The module skips, with the reason, where Slurm cannot
start (not root, no apt-get, no slurm-wlm). Every wait is bounded; jobs left behind by a
failing test are cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.children import REPO
from tests.support.runfolders import completed_epochs, epoch_losses
from tests.support.slurm_cluster import SlurmCluster, SlurmUnavailable, start_cluster

# One Slurm on this machine: its tests share one xdist worker (make test runs in parallel).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]
MGPU = REPO / ".venv" / "bin" / "mgpu"
RUN_TIMEOUT_S = 300
WORKER_TIMEOUT_S = "30"
# A killed worker is noticed at once (connection reset) or by the coordination service's
# heartbeat (10 s); WORKER_TIMEOUT bounds the rest.
SURVIVOR_EXIT_BOUND_S = 45


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    if not MGPU.exists():
        pytest.skip(f"{MGPU} is missing: make venv")
    try:
        cluster = start_cluster()
    except SlurmUnavailable as err:
        pytest.skip(f"no Slurm here: {err}")
    print(f"Slurm ready in {cluster.start_seconds:.1f} s ({cluster.conf})")
    yield cluster
    cluster.stop()


def free_port_pair() -> int:
    """A port p with p + 1 free too: the two tasks of a node listen on WORKER_PORT + local id."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def run_env(slurm: SlurmCluster, tmp_path: Path, **settings: str) -> dict[str, str]:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return slurm.env({
        "PATH": f"{MGPU.parent}:{os.environ['PATH']}",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "GPUS": "none",
        "DATASET": "digits",
        "BATCH_SIZE": "16",
        "EPOCHS": "2",
        "WORKER_PORT": str(free_port_pair()),
        "WORKER_TIMEOUT": WORKER_TIMEOUT_S,
        "HOME": str(tmp_path / "home"),  # an empty Keras cache
        "TMPDIR": str(scratch),  # where the non-chief worker puts its scratch checkpoints
        **settings,
    })


def task_log(tmp_path: Path, task: int) -> str:
    path = tmp_path / f"task-{task}.log"
    return path.read_text() if path.exists() else ""


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- task {t}:\n{task_log(tmp_path, t)[-3000:]}" for t in (0, 1))


def srun(tmp_path: Path, env: dict[str, str], *command: str, tasks: int = 2) -> list[str]:
    """srun's command line for one step of `tasks` tasks on the one node, a log per task."""
    return ["srun", "--nodes=1", f"--ntasks={tasks}", "--kill-on-bad-exit=0",
            f"--output={tmp_path}/task-%t.log", *command]


def per_task_output_dir(tmp_path: Path) -> list[str]:
    """`mgpu train` with OUTPUT_DIR=out<rank>: what the worker would write would show."""
    return ["bash", "-c", f'echo $$ > {tmp_path}/pid.$SLURM_PROCID; '
            f'OUTPUT_DIR={tmp_path}/out$SLURM_PROCID exec mgpu train']


def test_dry_run_of_an_srun_step_reports_one_cluster(slurm: SlurmCluster,
                                                     tmp_path: Path) -> None:
    env = run_env(slurm, tmp_path)
    port = int(env["WORKER_PORT"])
    done = subprocess.run(srun(tmp_path, env, "mgpu", "train", "--dry-run", "--json"),
                          env=env, cwd=tmp_path, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, logs(tmp_path)
    host = socket.gethostname().split(".")[0]
    for task in (0, 1):
        cluster = json.loads(task_log(tmp_path, task))["cluster"]
        assert cluster == {"engine": "slurm", "workers": [f"{host}:{port}", f"{host}:{port + 1}"],
                           "index": task, "chief": task == 0}


def test_srun_two_tasks_train_as_one_run_and_only_the_chief_writes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    env = run_env(slurm, tmp_path)
    done = subprocess.run(srun(tmp_path, env, *per_task_output_dir(tmp_path)), env=env,
                          cwd=tmp_path, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, logs(tmp_path)
    chief = json.loads((tmp_path / "out0" / "metrics.json").read_text())
    assert chief["replicas"] == 2 and chief["global_batch_size"] == 32
    assert chief["epochs_completed"] == 2
    losses = epoch_losses(task_log(tmp_path, 0))
    assert len(losses) == 2 and losses == epoch_losses(task_log(tmp_path, 1))
    assert not (tmp_path / "out1").exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert "[worker 1]" in task_log(tmp_path, 1)


SCRIPT = '''
import tensorflow as tf
import mgpu_env

strategy = mgpu_env.strategy()


@tf.function
def count_replicas():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0))


total = strategy.experimental_local_results(count_replicas())[0]
print(f"chief={mgpu_env.is_chief()} replicas={mgpu_env.num_replicas()} sum={float(total)}",
      flush=True)
'''


def test_srun_mgpu_run_of_a_script_joins_every_task(slurm: SlurmCluster,
                                                     tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(SCRIPT)
    env = run_env(slurm, tmp_path)
    done = subprocess.run(srun(tmp_path, env, "mgpu", "run", "allreduce.py"), env=env,
                          cwd=tmp_path, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, logs(tmp_path)
    assert "chief=True replicas=2 sum=2.0" in task_log(tmp_path, 0), logs(tmp_path)
    assert "chief=False replicas=2 sum=2.0" in task_log(tmp_path, 1), logs(tmp_path)


@pytest.mark.parametrize("victim", [1, 0], ids=["kill-worker", "kill-chief"])
def test_a_task_killed_with_sigkill_stops_the_other_naming_it(
    slurm: SlurmCluster, tmp_path: Path, victim: int
) -> None:
    env = run_env(slurm, tmp_path, EPOCHS="40")
    survivor = 1 - victim
    step = subprocess.Popen(srun(tmp_path, env, *per_task_output_dir(tmp_path)), env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while completed_epochs(tmp_path / "out0") < 2:
            assert step.poll() is None, logs(tmp_path)
            assert time.monotonic() < deadline, "2 epochs did not complete in time"
            time.sleep(0.1)
        os.kill(int((tmp_path / f"pid.{victim}").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        try:
            output, _ = step.communicate(timeout=SURVIVOR_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the survivor still runs {SURVIVOR_EXIT_BOUND_S} s after the kill")
        took = time.monotonic() - killed
    finally:
        if step.poll() is None:
            step.kill()
            step.wait(timeout=30)
    message = task_log(tmp_path, survivor)
    assert f"Worker {victim} stopped or cannot be reached" in message, logs(tmp_path)
    assert f"task {victim}: Killed" in output, output
    assert f"task {survivor}: Exited with exit code 1" in output, output
    print(f"survivor stopped {took:.1f} s after the kill")


def test_sbatch_job_sent_sigterm_checkpoints_requeues_itself_and_resumes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """slurm/train.sbatch as written, its GPU request and size overridden on sbatch's
    command line (which beats #SBATCH lines): mgpu comes from PATH, the run folder is
    runs/<job name>-<job id> under the submit folder."""
    env = run_env(slurm, tmp_path, EPOCHS="12")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0",
         "--time=20", str(REPO / "slurm" / "train.sbatch")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    run = tmp_path / "runs" / f"mgpu-train-{job_id}"
    log = tmp_path / f"mgpu-train-{job_id}.out"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while completed_epochs(run) < 2:
            assert slurm.job(job_id)["JobState"] in ("PENDING", "RUNNING"), log.read_text()
            assert time.monotonic() < deadline, "2 epochs did not complete in time"
            time.sleep(0.2)
        # Without --batch/--full, scancel signals the job's steps (the srun tasks), not the
        # batch shell, as the time limit's --signal=TERM@... does.
        slurm.run("scancel", "--signal=TERM", job_id)
        record = slurm.wait_job(job_id, {"PENDING"}, 120)
        assert record["JobState"] == "PENDING" and record["Restarts"] == "1", record
        kept = completed_epochs(run)
        assert 2 <= kept < 12
        # Requeued jobs wait the cluster's cred_expire (20 s here) before starting again.
        record = slurm.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, RUN_TIMEOUT_S)
    finally:
        if slurm.job(job_id).get("JobState") in ("PENDING", "RUNNING"):
            slurm.run("scancel", job_id)
    text = log.read_text()
    assert record["JobState"] == "COMPLETED", text[-4000:]
    # --open-mode=append: both runs of the job in one log.
    assert f"job {job_id} (restart 0): RUN_NAME=mgpu-train-{job_id}" in text
    assert f"job {job_id} (restart 1): RUN_NAME=mgpu-train-{job_id}" in text
    assert "SIGTERM received" in text and f"requeueing job {job_id}" in text
    assert f"Resuming from the checkpoint of epoch {kept}" in text, text[-4000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == kept and metrics["epochs_completed"] == 12
    assert metrics["replicas"] == 2
