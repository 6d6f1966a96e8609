"""`mgpu train --workers N` / `mgpu run --workers N`: N workers on this machine with one
command. The plan (ports, GPU shares, the run name) is tested as data; the supervisor with
real child processes and real signals; the whole with two real `mgpu train` workers."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.errors import ConfigError
from mgpu_env.runtime.cluster import local
from mgpu_env.runtime.cluster.local import LocalWorkers, gpu_shares, plan_local_workers, supervise

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ the plan


@pytest.mark.parametrize(
    ("workers", "selected", "per_worker", "shares"),
    [(2, [0, 1, 2, 3], None, ("0,1", "2,3")),
     (4, [0, 1, 2, 3], None, ("0", "1", "2", "3")),  # one process per GPU
     (2, [0, 1, 2, 3], 1, ("0", "1")),
     (2, [2, 5, 6, 7], 2, ("2,5", "6,7")),  # the selection's own indices, in order
     (3, [], None, (None, None, None))],  # the CPU: every worker keeps GPUS as it is
)
def test_each_worker_gets_its_share_of_the_gpus(
    workers: int, selected: list[int], per_worker: int | None, shares: tuple[str | None, ...]
) -> None:
    assert gpu_shares(workers, selected, per_worker) == shares


@pytest.mark.parametrize(
    ("workers", "selected", "per_worker", "message"),
    [(3, [0, 1, 2, 3], None, "cannot share 4 GPU(s) evenly"),
     (3, [0, 1, 2, 3], 2, "needs 6 GPUs; 4 are selected"),
     (2, [], 1, "no GPU is selected here")],
)
def test_shares_that_do_not_fit_are_refused_with_the_fix(
    workers: int, selected: list[int], per_worker: int | None, message: str
) -> None:
    with pytest.raises(ConfigError, match="Fix:") as error:
        gpu_shares(workers, selected, per_worker)
    assert message in str(error.value)


def test_the_plan_gives_every_worker_the_same_hosts_its_index_and_one_run_name() -> None:
    plan = plan_local_workers(2, [0, 1], None, has_run_folder=False, cluster_engine=None,
                              now=0.0)
    first, second = plan.environment(0), plan.environment(1)
    assert first["WORKER_HOSTS"] == second["WORKER_HOSTS"]
    hosts = first["WORKER_HOSTS"].split(",")
    assert len(set(hosts)) == 2 and all(h.startswith("127.0.0.1:") for h in hosts)
    assert (first["WORKER_INDEX"], second["WORKER_INDEX"]) == ("0", "1")
    assert (first["GPUS"], second["GPUS"]) == ("0", "1")
    assert first["RUN_NAME"] == second["RUN_NAME"] == "19700101-000000"
    named = plan_local_workers(2, [], None, has_run_folder=True, cluster_engine=None)
    assert "RUN_NAME" not in named.environment(0) and "GPUS" not in named.environment(0)


def test_free_loopback_ports_are_distinct_and_free() -> None:
    ports = local.free_loopback_ports(4)
    assert len(set(ports)) == 4 and all(1024 <= p < 65536 for p in ports)


@pytest.mark.parametrize(("workers", "engine", "message"),
                         [(0, None, "out of range"), (2, "slurm", "already a worker")])
def test_plans_that_cannot_be_are_refused(workers: int, engine: str | None,
                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_local_workers(workers, [], None, has_run_folder=True, cluster_engine=engine)


# ------------------------------------------------------------------------ the supervisor


def python_workers(body: str) -> list[str]:
    """argv of a worker written in Python; it sees WORKER_INDEX like an mgpu worker."""
    return [sys.executable, "-c", textwrap.dedent(body)]


def fixed_plan(count: int) -> LocalWorkers:
    return LocalWorkers(tuple(f"127.0.0.1:{10000 + i}" for i in range(count)),
                        (None,) * count, None)


def test_all_workers_succeed_and_every_line_is_tagged_once() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = supervise(fixed_plan(2), python_workers("""
        import os, sys
        i = os.environ["WORKER_INDEX"]
        print("hello from", i, os.environ["WORKER_HOSTS"])
        print(f"[worker {i}] already tagged")
        print("to stderr", file=sys.stderr)
    """), dict(os.environ), stdout=out, stderr=err)
    assert code == 0
    lines = sorted(out.getvalue().splitlines())
    assert lines == [
        "[worker 0] already tagged",
        "[worker 0] hello from 0 127.0.0.1:10000,127.0.0.1:10001",
        "[worker 1] already tagged",
        "[worker 1] hello from 1 127.0.0.1:10000,127.0.0.1:10001",
    ]
    assert sorted(err.getvalue().splitlines()) == ["[worker 0] to stderr",
                                                   "[worker 1] to stderr"]


STOPPABLE = """
    import os, signal, sys, time
    i = int(os.environ["WORKER_INDEX"])
    def stop(sig, frame):
        print(f"worker {i} stopped by signal {sig}", flush=True)
        sys.exit(128 + sig)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    if i == 1 and os.environ.get("FAIL"):
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(60)
"""


def test_one_failing_worker_stops_the_others_and_its_code_is_the_launchers() -> None:
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = supervise(fixed_plan(3), python_workers(STOPPABLE), {**os.environ, "FAIL": "1"},
                     stdout=out, stderr=err)
    assert code == 3
    assert time.monotonic() - started < 30
    assert "mgpu: worker 1 exited 3; stopping the other workers" in err.getvalue()
    for index in (0, 2):
        assert f"[worker {index}] worker {index} stopped by signal 15" in out.getvalue()


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_time() -> None:
    body = STOPPABLE.replace("signal.signal(signal.SIGTERM, stop)",
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    started = time.monotonic()
    code = supervise(fixed_plan(2), python_workers(body), {**os.environ, "FAIL": "1"},
                     stdout=io.StringIO(), stderr=io.StringIO(), grace_s=1.0)
    assert code == 3 and time.monotonic() - started < 20


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_launcher_reaches_every_worker(
    tmp_path: Path, sig: signal.Signals, expected: int
) -> None:
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent(f"""
        import os, sys
        from mgpu_env.runtime.cluster.local import LocalWorkers, supervise
        plan = LocalWorkers(("127.0.0.1:1", "127.0.0.1:2"), (None, None), None)
        argv = [sys.executable, "-c", {textwrap.dedent(STOPPABLE)!r}]
        sys.exit(supervise(plan, argv, dict(os.environ)))
    """))
    process = subprocess.Popen([sys.executable, str(launcher)], cwd=REPO, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        ready = [process.stdout.readline() for _ in range(2)]
        assert all(line.endswith("ready\n") for line in ready), ready
        process.send_signal(sig)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == expected, err
    for index in (0, 1):
        assert f"[worker {index}] worker {index} stopped by signal {int(sig)}" in out


# ---------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [(["train", "--workers", "0"], {}, "out of range"),
     (["train", "--workers", "2", "--dry-run", "--json"], {}, "--json prints one plan"),
     (["train", "--workers", "2"], {"WORKER_HOSTS": "a:1,b:1", "WORKER_INDEX": "0"},
      "already a worker of a cluster"),
     (["train", "--workers", "2", "--gpus-per-worker", "1"], {"GPUS": "none"},
      "no GPU is selected"),
     (["run", "--workers", "2", "no-such-script.py"], {}, "no-such-script.py")],
)
def test_bad_worker_requests_exit_2_before_any_worker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args, env={"GPUS": "none", **env})
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_two_workers_train_the_packaged_model_with_one_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "MGPU_DEBUG", "WORKER_HOSTS", "WORKER_INDEX")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", GPUS="none",
               DATASET="digits", BATCH_SIZE="16", HOME=str(tmp_path / "home"),
               TMPDIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint", "train", "--workers", "2", "--epochs", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 workers on this machine" in result.stderr
    for line in result.stdout.splitlines():
        assert line.startswith(("[worker 0] ", "[worker 1] ")), line
    # One run folder, named once by the launcher, written by the chief only.
    (run,) = (tmp_path / "runs").iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["epochs_completed"] == 1
    assert metrics["settings"]["EPOCHS"] == "1"


@pytest.mark.slow
def test_two_workers_run_a_script_with_one_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "MGPU_DEBUG", "WORKER_HOSTS", "WORKER_INDEX")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", GPUS="none",
               RUN_NAME="loop", HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path))
    script = str(REPO / "examples" / "custom_loop.py")
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint", "run", "--workers", "2", script, "--epochs", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The script's own lines carry their worker's tag, and both trained one model.
    accuracies = {line.split("] ", 1)[0]: line.rsplit(" ", 1)[1]
                  for line in result.stdout.splitlines() if "test accuracy:" in line}
    assert set(accuracies) == {"[worker 0", "[worker 1"}
    assert len(set(accuracies.values())) == 1
    assert (tmp_path / "runs" / "loop" / "checkpoints").is_dir()
