"""docker-compose.multiworker.yml: two worker containers train together, a kill, a network
cut off (`docker network disconnect`), and the resume after each.

The same checks as tests/processes/test_multiworker_run.py, with each worker in its own container
and address on the compose network. The image is built with the container check's own
scripts (docker/build-base-image.sh, docker/build-image.sh: a CPU base, no registry), so
the first run takes minutes and later ones reuse the cached layers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.children import REPO as ROOT
from tests.support.docker import docker_engine_missing
from tests.support.runfolders import completed_epochs, epoch_losses

COMPOSE_FILE = ROOT / "docker-compose.multiworker.yml"
BASE_CPU_IMAGE = os.environ.get("BASE_CPU_IMAGE", "mgpu-env/base-cpu:bookworm")
TEST_IMAGE = os.environ.get("TEST_IMAGE", "mgpu-env:cpu")
SURVIVOR_EXIT_BOUND_S = 60

# The image and compose project are shared with test_container: one xdist worker for both.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("docker")]


def compose_command() -> list[str] | None:
    """Compose v2 where installed, else v1 (`docker-compose`), like docker/lib.sh."""
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if v2.returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


class Project:
    """One compose project on the multi-worker file, with its own env file and runs folder."""

    def __init__(self, work: Path, compose: list[str]) -> None:
        self.name = f"mgpu-mw-{os.getpid()}"
        self.work = work
        self.runs = work / "runs"
        self.runs.mkdir()
        (work / "data").mkdir()
        uid, gid = (4242, 4242) if os.getuid() == 0 else (os.getuid(), os.getgid())
        if os.getuid() == 0:
            os.chown(self.runs, uid, gid)
        self.env_file = work / "compose.env"
        self.env_file.write_text(
            f"MGPU_IMAGE={TEST_IMAGE}\nBASE_IMAGE={BASE_CPU_IMAGE}\n"
            f"HOST_UID={uid}\nHOST_GID={gid}\n"
            f"HOST_RUNS_DIR={self.runs}\nHOST_DATA_DIR={work / 'data'}\n"
            "DATASET=digits\nBATCH_SIZE=16\nRUN_NAME=mw\nGPUS=none\n"
            "WORKER_TIMEOUT=60\nTF_CPP_MIN_LOG_LEVEL=2\n"
        )
        self.compose = compose

    def run(self, *args: str, timeout: float = 600, extra_env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        # Only this test's settings: the caller's shell must not leak any in.
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG")}
        env.update(extra_env or {})
        result = subprocess.run(
            [*self.compose, "--project-name", self.name, "--env-file", str(self.env_file),
             "-f", str(COMPOSE_FILE), *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and result.returncode != 0:
            pytest.fail(f"compose {' '.join(args)} exited {result.returncode}:\n"
                        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def exit_code(self, service: str) -> int:
        inspected = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.ExitCode}}", self.container(service)],
            capture_output=True, text=True, check=True,
        )
        return int(inspected.stdout.strip())

    def logs(self, service: str) -> str:
        return self.run("logs", "--no-color", service).stdout

    def up(self, **settings: str) -> None:
        """Both workers, in the foreground, until both have exited."""
        self.run("up", "--no-build", "--force-recreate", extra_env=settings, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    reason = docker_engine_missing()
    if reason:
        pytest.skip(reason)
    compose = compose_command()
    if compose is None:
        pytest.skip("requires docker compose (v2) or docker-compose (v1)")
    for script, env in (
        (["docker/build-base-image.sh", BASE_CPU_IMAGE], {}),
        (["docker/build-image.sh"], {"IMAGE": TEST_IMAGE, "BASE_IMAGE": BASE_CPU_IMAGE}),
    ):
        built = subprocess.run(script, cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                               text=True, timeout=3000, check=False)
        assert built.returncode == 0, f"{script[0]} failed:\n{built.stderr[-4000:]}"
    work = tmp_path_factory.mktemp("multiworker-compose")
    work.chmod(0o755)
    project = Project(work, compose)
    try:
        yield project
    finally:
        project.run("down", "--volumes", "--remove-orphans", check=False, timeout=120)




def test_two_containers_train_together(project: Project) -> None:
    project.up(EPOCHS="2")
    logs = {service: project.logs(service) for service in ("worker0", "worker1")}
    assert [project.exit_code("worker0"), project.exit_code("worker1")] == [0, 0], logs
    metrics = json.loads((project.runs / "mw" / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["epochs_completed"] == 2
    losses = epoch_losses(logs["worker0"])
    assert len(losses) == 2 and losses == epoch_losses(logs["worker1"]), logs
    # Both containers mount the same runs folder; only the chief wrote into it.
    assert sorted(p.name for p in (project.runs).iterdir()) == ["mw"]


def test_killing_a_container_stops_the_other_and_both_resume(project: Project) -> None:
    shutil.rmtree(project.runs / "mw", ignore_errors=True)
    project.run("up", "-d", "--no-build", "--force-recreate", extra_env={"EPOCHS": "40"})
    deadline = time.monotonic() + 300
    while completed_epochs(project.runs / "mw") < 2:
        assert time.monotonic() < deadline, project.logs("worker0")[-3000:]
        time.sleep(0.2)
    subprocess.run(["docker", "kill", project.container("worker1")], check=True,
                   capture_output=True)
    killed = time.monotonic()
    waited = subprocess.run(["docker", "wait", project.container("worker0")],
                            capture_output=True, text=True, timeout=SURVIVOR_EXIT_BOUND_S,
                            check=False)
    took = time.monotonic() - killed
    assert waited.stdout.strip() == "1", project.logs("worker0")[-3000:]
    assert "Worker 1 stopped or cannot be reached" in project.logs("worker0")
    print(f"worker0 exited {took:.1f} s after worker1 was killed")

    kept = completed_epochs(project.runs / "mw")
    project.up(EPOCHS=str(kept + 1))
    assert [project.exit_code("worker0"), project.exit_code("worker1")] == [0, 0]
    metrics = json.loads((project.runs / "mw" / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == kept and metrics["epochs_completed"] == kept + 1


def inspect(container: str, template: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", template, container], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def wait_for_epoch(project: Project, epoch: int, deadline: float) -> float:
    """Until the chief has checkpointed `epoch`; the time it saw it."""
    while completed_epochs(project.runs / "mw") < epoch:
        assert time.monotonic() < deadline, project.logs("worker0")[-3000:]
        time.sleep(0.1)
    return time.monotonic()


# WORKER_TIMEOUT of this test, and the backstop: the watchdog's deadline, then the
# faulthandler grace (faults.BACKSTOP_GRACE_S) and the helper's margin; the slack is for a
# loaded machine.
PARTITION_WORKER_TIMEOUT_S = 30
PARTITION_BACKSTOP_S = PARTITION_WORKER_TIMEOUT_S + 5 + 1
PARTITION_SLACK_S = 30


def test_a_worker_cut_off_its_network_stops_both_and_a_restart_loses_nothing(
    project: Project,
) -> None:
    """`docker network disconnect` mid-epoch: no reset, no refused connection, packets go
    nowhere. The chief must stop within its backstop naming the lost worker, and the same
    two containers, reconnected and started again, resume from the last checkpoint."""
    shutil.rmtree(project.runs / "mw", ignore_errors=True)
    # Synthetic rows: epochs of 1875 steps, long enough to cut the network inside one.
    project.run("up", "-d", "--no-build", "--force-recreate", extra_env={
        "EPOCHS": "4", "DATASET": "synthetic", "WORKER_TIMEOUT": str(PARTITION_WORKER_TIMEOUT_S),
    })
    chief, worker = project.container("worker0"), project.container("worker1")
    (network,) = inspect(worker, "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}"
                         ).split()
    deadline = time.monotonic() + 600
    first = wait_for_epoch(project, 1, deadline)
    second = wait_for_epoch(project, 2, deadline)
    time.sleep((second - first) / 2)  # the middle of epoch 3
    kept = completed_epochs(project.runs / "mw")
    assert kept == 2, "epoch 3 ended before the network was cut; its epochs are too short"
    subprocess.run(["docker", "network", "disconnect", network, worker], check=True,
                   capture_output=True, timeout=60)
    cut = time.monotonic()
    waited = subprocess.run(["docker", "wait", chief], capture_output=True, text=True,
                            timeout=PARTITION_BACKSTOP_S + PARTITION_SLACK_S, check=False)
    took = time.monotonic() - cut
    chief_log = project.logs("worker0")
    assert waited.stdout.strip() == "1", chief_log[-3000:]
    # Either TensorFlow's heartbeat names it, or the backstop's probe of its address does.
    assert re.search(r"error: (Worker 1 stopped or cannot be reached|.*worker 1 \(worker1:2222\))",
                     chief_log), chief_log[-3000:]
    print(f"worker0 exited {took:.1f} s after worker1's network was cut "
          f"(backstop {PARTITION_BACKSTOP_S} s), saying:")
    print("\n".join(line for line in chief_log.splitlines() if "error:" in line
                    or "Fix:" in line or "TensorFlow:" in line))
    subprocess.run(["docker", "wait", worker], capture_output=True, check=False,
                   timeout=PARTITION_BACKSTOP_S + PARTITION_SLACK_S)  # it stops by itself too
    assert inspect(worker, "{{.State.Running}}") == "false", project.logs("worker1")[-3000:]
    assert completed_epochs(project.runs / "mw") == kept  # nothing saved after the cut

    subprocess.run(["docker", "network", "connect", "--alias", "worker1", network, worker],
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["docker", "start", chief, worker], check=True, capture_output=True,
                   timeout=120)
    codes = subprocess.run(["docker", "wait", chief, worker], capture_output=True, text=True,
                           timeout=600, check=False).stdout.split()
    logs = {service: project.logs(service) for service in ("worker0", "worker1")}
    assert codes == ["0", "0"], logs["worker0"][-3000:] + logs["worker1"][-3000:]
    metrics = json.loads((project.runs / "mw" / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == kept and metrics["epochs_completed"] == 4
    assert metrics["dataset"] == "synthetic"
    assert [e["epoch"] for e in metrics["history"]] == [1, 2, 3, 4]
    # The restarted pair trained one model: the same loss after each resumed epoch on both.
    resumed = [epoch_losses(logs[s])[-2:] for s in ("worker0", "worker1")]
    assert resumed[0] == resumed[1] and len(resumed[0]) == 2, logs
