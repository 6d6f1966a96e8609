"""`mgpu train --workers N` / `mgpu run --workers N`: N workers on this machine with one
command. The plan (ports, GPU shares, the run name) is tested as data; the supervisor with
real child processes and real signals; the whole with two real `mgpu train` workers."""

from __future__ import annotations

import contextlib
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
from mgpu_env.runtime.cluster.local import (
    LaunchingHere,
    LocalWorkers,
    Supervision,
    gpu_shares,
    plan_local_workers,
    supervise,
)
from tests.support.children import REPO, child_env

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
    plan = plan_local_workers(2, None, LaunchingHere([0, 1], has_run_folder=False), now=0.0)
    first, second = plan.environment(0), plan.environment(1)
    assert first["WORKER_HOSTS"] == second["WORKER_HOSTS"]
    hosts = first["WORKER_HOSTS"].split(",")
    assert len(set(hosts)) == 2 and all(h.startswith("127.0.0.1:") for h in hosts)
    assert (first["WORKER_INDEX"], second["WORKER_INDEX"]) == ("0", "1")
    assert (first["GPUS"], second["GPUS"]) == ("0", "1")
    assert first["RUN_NAME"] == second["RUN_NAME"] == "19700101-000000"
    named = plan_local_workers(2, None, LaunchingHere([], has_run_folder=True))
    assert "RUN_NAME" not in named.environment(0) and "GPUS" not in named.environment(0)


def test_free_loopback_ports_are_distinct_and_free() -> None:
    ports = local.free_loopback_ports(4)
    assert len(set(ports)) == 4 and all(1024 <= p < 65536 for p in ports)


@pytest.mark.parametrize(("workers", "engine", "message"),
                         [(0, None, "out of range"), (2, "slurm", "already a worker")])
def test_plans_that_cannot_be_are_refused(workers: int, engine: str | None,
                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_local_workers(workers, None, LaunchingHere([], True, cluster_engine=engine))


# ------------------------------------------------------------------------ the supervisor


def python_workers(body: str) -> list[str]:
    """argv of a worker written in Python; it sees WORKER_INDEX like an mgpu worker."""
    return [sys.executable, "-c", textwrap.dedent(body)]


def fixed_plan(count: int) -> LocalWorkers:
    return LocalWorkers(tuple(f"127.0.0.1:{10000 + i}" for i in range(count)),
                        (None,) * count, None)


def test_all_workers_succeed_and_every_line_is_tagged_once(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = supervise(fixed_plan(2), python_workers("""
        import os, sys
        i = os.environ["WORKER_INDEX"]
        print("hello from", i, os.environ["WORKER_HOSTS"])
        print(f"[worker {i}] already tagged")
        print("to stderr", file=sys.stderr)
    """), child_env(tmp_path), how=Supervision(stdout=out, stderr=err))
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
        print(f"error: worker {i}: the run stalled in the first step.", file=sys.stderr)
        print("  Most likely: ...", file=sys.stderr, flush=True)
        os._exit(3)
    time.sleep(60)
"""


def test_one_failing_worker_stops_the_others_and_its_code_is_the_launchers(
    tmp_path: Path
) -> None:
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = supervise(fixed_plan(3), python_workers(STOPPABLE), child_env(tmp_path, FAIL="1"),
                     how=Supervision(stdout=out, stderr=err))
    assert code == 3
    assert time.monotonic() - started < 30
    # Which worker stalled, and where: its report's first line, said again by the launcher.
    assert ("mgpu: worker 1 exited 3 (stalled: worker 1: the run stalled in the first "
            "step.); stopping the other workers") in err.getvalue()
    for index in (0, 2):
        assert f"[worker {index}] worker {index} stopped by signal 15" in out.getvalue()


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_time(tmp_path: Path) -> None:
    body = STOPPABLE.replace("signal.signal(signal.SIGTERM, stop)",
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    started = time.monotonic()
    code = supervise(fixed_plan(2), python_workers(body), child_env(tmp_path, FAIL="1"),
                     how=Supervision(stdout=io.StringIO(), stderr=io.StringIO(), grace_s=1.0))
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
     (["run", "--workers", "2", "no-such-script.py"], {}, "no-such-script.py"),
     (["train", "--max-restarts", "2", "--resume-from", "ckpt-1"], {},
      "every restart would go back to it again"),
     (["train", "--max-restarts", "2", "--min-gpus", "0"], {}, "a whole number from 1 to 1024"),
     (["run", "--max-restarts", "1", "x.py"], {}, "--max-restarts 1 restarts the workers"),
     (["train", "--workers", "2", "--max-restarts", "-1"], {}, "from 0 to 1000"),
     (["train", "--workers", "2"], {"MAX_RESTARTS": "many"}, "MAX_RESTARTS")],
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


# ------------------------------------------------------------------------- restarts

# Worker 1 fails (FAIL_CODE, or kills itself with FAIL_SIGNAL) while the marker file
# counts fewer than FAIL_TIMES of its starts; every start of every worker is recorded.
FLAKY = """
    import os, signal, sys, time
    from pathlib import Path
    i = int(os.environ["WORKER_INDEX"])
    record = Path(os.environ["RECORD"])
    with record.open("a") as f:
        f.write(f"{i} {os.environ['WORKER_HOSTS']}\\n")
    def stop(sig, frame):
        sys.exit(128 + sig)
    signal.signal(signal.SIGTERM, stop)
    starts = sum(1 for line in record.read_text().splitlines() if line.startswith("1 "))
    if i == 1 and starts <= int(os.environ["FAIL_TIMES"]):
        time.sleep(0.3)
        if os.environ.get("FAIL_SIGNAL"):
            os.kill(os.getpid(), int(os.environ["FAIL_SIGNAL"]))
        sys.exit(int(os.environ.get("FAIL_CODE", "3")))
    time.sleep(0 if i == 1 else 1.0)  # worker 0 is still running when 1 fails
    sys.exit(0)
"""


def run_flaky(tmp_path: Path, max_restarts: int, **env: str) -> tuple[int, str, list[str]]:
    """supervise() on FLAKY: the launcher's code, its stderr, each start recorded."""
    record = tmp_path / "starts"
    record.touch()
    fresh = iter(range(100, 200, 2))
    err = io.StringIO()
    code = supervise(
        LocalWorkers(("127.0.0.1:2", "127.0.0.1:1"), (None, None), None),
        python_workers(FLAKY), {**os.environ, "RECORD": str(record), **env},
        Supervision(max_restarts=max_restarts, stdout=io.StringIO(), stderr=err, grace_s=5.0,
                    poll_s=0.05, ports=lambda n: [next(fresh) for _ in range(n)]),
    )
    return code, err.getvalue(), record.read_text().splitlines()


def test_a_dead_worker_restarts_all_on_fresh_ports_and_the_run_ends_well(
    tmp_path: Path,
) -> None:
    code, err, starts = run_flaky(tmp_path, 2, FAIL_TIMES="1")
    assert code == 0, err
    # Both started twice; the second time on ports the launcher took afresh.
    assert sorted(starts) == ["0 127.0.0.1:100,127.0.0.1:102", "0 127.0.0.1:2,127.0.0.1:1",
                              "1 127.0.0.1:100,127.0.0.1:102", "1 127.0.0.1:2,127.0.0.1:1"]
    assert err.splitlines() == [
        "mgpu: worker 1 exited 3; stopping the other workers",
        "mgpu: restart 1 of 2 (worker 1 exited 3): starting all 2 workers again from the "
        "last checkpoint",
    ]


def test_restarts_stop_when_all_are_used_with_the_last_failures_code(tmp_path: Path) -> None:
    code, err, starts = run_flaky(tmp_path, 2, FAIL_TIMES="5", FAIL_SIGNAL="9")
    assert code == 137  # killed by SIGKILL, as a shell reports it
    assert sum(line.startswith("1 ") for line in starts) == 3  # the first start + 2 restarts
    cause = "worker 1 exited 137 (killed by SIGKILL)"
    assert f"mgpu: restart 1 of 2 ({cause})" in err
    assert f"mgpu: restart 2 of 2 ({cause})" in err
    assert err.splitlines()[-1] == f"mgpu: {cause}; no restart left (MAX_RESTARTS=2, all used)"


def test_bad_settings_are_not_restarted(tmp_path: Path) -> None:
    code, err, starts = run_flaky(tmp_path, 3, FAIL_TIMES="5", FAIL_CODE="2")
    assert code == 2 and sum(line.startswith("1 ") for line in starts) == 1
    assert "a restart would fail the same way; not restarting" in err


def test_without_restarts_the_log_is_as_before(tmp_path: Path) -> None:
    code, err, starts = run_flaky(tmp_path, 0, FAIL_TIMES="5")
    assert code == 3 and len(starts) == 2
    assert err.splitlines() == ["mgpu: worker 1 exited 3; stopping the other workers"]


# Each worker makes its scratch folder as an mgpu worker does (sweeping those of workers that
# are gone first), writes a checkpoint file there and a file of its own in TMPDIR (as
# TensorFlow or a script may), and records what its TMPDIR held at its start; worker 1 kills
# itself (SIGKILL: nothing of its own is removed) on its first start.
LITTERING = """
    import os, signal, sys, tempfile, time
    from pathlib import Path
    from mgpu_env.runtime.strategy import WorkerRole
    from mgpu_env.training.multiworker.scratch import remove_scratch_dir, scratch_dir
    i = int(os.environ["WORKER_INDEX"])
    record = Path(os.environ["RECORD"])
    seen = [p.name for p in Path(tempfile.gettempdir()).iterdir()]  # before its own sweep
    folder = scratch_dir(WorkerRole("worker", i, 2))
    (folder.path / "ckpt-1-10.data-00000-of-00001").write_bytes(b"0" * 1000)
    _, own = tempfile.mkstemp(prefix="left-by-worker-")
    with record.open("a") as f:
        f.write(f"{i} {os.environ['WORKER_HOSTS']} {folder.path.name} {Path(own).name} "
                f"{' '.join(seen)}\\n")
    if i == 1 and sum(line.startswith("1 ") for line in record.read_text().splitlines()) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ.get("LINGER", "0.5")))
    remove_scratch_dir(folder)
"""


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_killed_workers_scratch_and_temporary_files_are_removed_at_restart_and_end(
    tmp_path: Path,
) -> None:
    tmp, record = tmp_path / "tmp", tmp_path / "record"
    tmp.mkdir()
    record.touch()
    fresh = iter(range(100, 200, 2))
    code = supervise(
        LocalWorkers(("127.0.0.1:2", "127.0.0.1:1"), (None, None), None),
        python_workers(LITTERING),
        {**child_env(tmp_path), "RECORD": str(record), "TMPDIR": str(tmp)},
        Supervision(max_restarts=1, stdout=io.StringIO(), stderr=io.StringIO(), grace_s=5.0,
                    poll_s=0.05, ports=lambda n: [next(fresh) for _ in range(n)]),
    )
    assert code == 0
    starts = [line.split() for line in record.read_text().splitlines()]
    first = {name for _, hosts, *names in starts if hosts == "127.0.0.1:2,127.0.0.1:1"
             for name in names[:2]}
    again = [seen for _, hosts, _, _, *seen in starts if hosts != "127.0.0.1:2,127.0.0.1:1"]
    # Worker 1 made its scratch folder and its file before it was killed; no start after the
    # restart saw anything of the first attempt's workers: the launcher removed it all.
    assert any(name.startswith("mgpu-worker1") for name in first) and len(again) == 2, starts
    assert [name for seen in again for name in seen if name in first] == [], starts
    assert files_under(tmp) == [] and list(tmp.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="requires Linux (prctl)")
def test_what_a_killed_launcher_left_is_removed_by_the_next_start(tmp_path: Path) -> None:
    tmp, record = tmp_path / "tmp", tmp_path / "record"
    tmp.mkdir()
    record.write_text("1 first start\n")  # worker 1 does not kill itself
    launch = textwrap.dedent("""
        import io, os, sys
        from mgpu_env.runtime.cluster.local import LocalWorkers, supervise
        supervise(LocalWorkers(("127.0.0.1:2", "127.0.0.1:1"), (None, None), None),
                  [sys.executable, "-c", sys.argv[1]], dict(os.environ))
    """)
    env = {**child_env(tmp_path), "RECORD": str(record), "TMPDIR": str(tmp), "LINGER": "60"}
    launcher = subprocess.Popen([sys.executable, "-c", launch, textwrap.dedent(LITTERING)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(record.read_text().splitlines()) < 3:  # both workers wrote their files
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        launcher.kill()  # SIGKILL: the launcher removes nothing; its workers die with it
        launcher.wait(timeout=10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    deadline = time.monotonic() + 10
    while workers_of(launcher.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = files_under(tmp)
    assert len([f for f in left if "-ckpt-" in f]) == 4, left  # 2 scratch folders' files
    assert len([f for f in left if "left-by-worker-" in f]) == 2, left
    code = supervise(fixed_plan(1), python_workers("print('a later run')"), child_env(tmp_path)
                     | {"TMPDIR": str(tmp)},
                     Supervision(stdout=io.StringIO(), stderr=io.StringIO()))
    assert code == 0 and files_under(tmp) == [] and list(tmp.iterdir()) == []


def test_an_owned_folder_is_swept_once_its_owner_is_killed_and_never_while_it_lives(
    tmp_path: Path,
) -> None:
    from mgpu_env.runtime.cluster.scratch import sweep_abandoned

    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from mgpu_env.runtime.cluster.scratch import owned_folder
        print(owned_folder("worker1-ckpt-", Path(sys.argv[1])).path, flush=True)
        time.sleep(60)
    """), str(tmp_path)], env=child_env(tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        folder = Path(owner.stdout.readline().strip())
        (tmp_path / "mgpu-bench-profile-x").mkdir()  # not made by owned_folder: never swept
        assert sweep_abandoned(tmp_path) == [] and folder.is_dir()
        owner.kill()  # SIGKILL: the kernel releases the owner's lock
        owner.wait(timeout=10)
        assert sweep_abandoned(tmp_path) == [folder] and not folder.exists()
        assert (tmp_path / "mgpu-bench-profile-x").is_dir()
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_temporary_folder_that_cannot_be_made_is_exit_2_before_any_worker(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record"
    with pytest.raises(ConfigError, match=r"(?s)cannot be made in .*nowhere.*Fix: point TMPDIR"):
        supervise(fixed_plan(2), python_workers(LITTERING),
                  {**child_env(tmp_path), "RECORD": str(record),
                   "TMPDIR": str(tmp_path / "nowhere")},
                  Supervision(stdout=io.StringIO(), stderr=io.StringIO()))
    assert not record.exists()


def test_the_cause_is_the_worker_that_failed_first_even_when_seen_together() -> None:
    # Worker 1 fails, worker 0 follows it (as a worker whose peer died does); the launcher
    # looks only once both have ended, and still names worker 1.
    body = """
        import os, sys, time
        i = int(os.environ["WORKER_INDEX"])
        time.sleep(1.2 if i == 0 else 0.3)
        sys.exit(1 if i == 0 else 5)
    """
    err = io.StringIO()
    code = supervise(fixed_plan(2), python_workers(body), dict(os.environ),
                     how=Supervision(stdout=io.StringIO(), stderr=err, poll_s=3.0))
    assert code == 5
    assert err.getvalue().splitlines() == ["mgpu: worker 1 exited 5; stopping the other workers"]


@pytest.mark.parametrize(("returncode", "said"), [
    (0, "exited 0"), (3, "exited 3"), (-9, "exited 137 (killed by SIGKILL)"),
    (-15, "exited 143 (killed by SIGTERM)"), (-6, "exited 134 (killed by SIGABRT)"),
])
def test_a_workers_end_is_named_with_its_signal(returncode: int, said: str) -> None:
    assert local.describe_exit(returncode) == said


# ---------------------------------------------------------------- no orphaned worker

# A worker that says its pid and then lives for a minute, deaf to SIGTERM and SIGHUP.
LINGERING = """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    print("pid", os.getpid(), flush=True)
    time.sleep(60)
"""


def alive(pid: int) -> bool:
    """Whether `pid` runs, as /proc tells it (a zombie waiting for its reaper is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="requires Linux (prctl)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGUSR1])  # no handler runs: the kernel
def test_a_launcher_killed_by_a_signal_leaves_no_worker_behind(
    tmp_path: Path, sig: signal.Signals
) -> None:
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent(f"""
        import os, sys
        from mgpu_env.runtime.cluster.local import LocalWorkers, Supervision, supervise
        plan = LocalWorkers(("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), (None,) * 3, None)
        argv = [sys.executable, "-c", {textwrap.dedent(LINGERING)!r}]
        sys.exit(supervise(plan, argv, dict(os.environ), Supervision(max_restarts=2)))
    """))
    process = subprocess.Popen([sys.executable, str(launcher)], cwd=REPO, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        pids = [int(process.stdout.readline().split()[-1]) for _ in range(3)]
        assert all(alive(pid) for pid in pids)
        process.send_signal(sig)
        assert process.wait(timeout=10) == -sig
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if alive(pid)] == []
    finally:
        for pid in pids if "pids" in locals() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="requires Linux (prctl)")
@pytest.mark.parametrize(("launcher_is_parent", "returncode"), [(True, 0), (False, -9)])
def test_a_worker_whose_launcher_died_before_it_was_tied_kills_itself(
    launcher_is_parent: bool, returncode: int
) -> None:
    # The race the parent check closes: the launcher died between the fork and the prctl,
    # so the worker's parent is another process already. Its stand-in here: a pid given
    # that is not the child's parent.
    body = f"""
        import os
        from mgpu_env.runtime.cluster.local import die_with_launcher
        parent = os.getppid() if {launcher_is_parent} else os.getppid() + 100000
        die_with_launcher(parent)()
    """
    done = subprocess.run(python_workers(body), cwd=REPO, env={**os.environ,
                          "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=30)
    assert done.returncode == returncode, done.stderr


def workers_of(launcher_pid: int) -> dict[int, int]:
    """The launcher's children that are workers, as /proc lists them: WORKER_INDEX -> pid."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != launcher_pid:
            continue
        for item in environ:
            if item.startswith(b"WORKER_INDEX="):
                found[int(item.split(b"=", 1)[1])] = int(entry.name)
    return found


def launcher_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "MGPU_DEBUG", "WORKER_HOSTS", "WORKER_INDEX")}
    env.update({"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "GPUS": "none",
                "DATASET": "digits", "BATCH_SIZE": "16", "QUIET": "1",
                "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path), **settings})
    return env


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="requires Linux (/proc)")
def test_a_worker_killed_mid_run_is_restarted_and_the_run_resumes(tmp_path: Path) -> None:
    from tests.support.runfolders import completed_epochs

    out = tmp_path / "out"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "train", "--workers", "2", "--max-restarts", "1"],
        cwd=tmp_path, env=launcher_env(tmp_path, EPOCHS="8", OUTPUT_DIR=str(out), QUIET="0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while completed_epochs(out) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        victim = workers_of(launcher.pid)[1]
        os.kill(victim, signal.SIGKILL)
        kept = completed_epochs(out)
        stdout, stderr = launcher.communicate(timeout=400)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "up to 1 restart(s) if one dies" in stderr
    assert ("mgpu: restart 1 of 1 (worker 1 exited 137 (killed by SIGKILL)): starting all 2 "
            "workers again from the last checkpoint") in stderr
    metrics = json.loads((out / "metrics.json").read_text())
    # The restart resumed from the chief's last checkpoint: no completed epoch was lost.
    assert metrics["resumed_from_epoch"] >= kept and metrics["epochs_completed"] == 8
    assert [e["epoch"] for e in metrics["history"]] == list(range(1, 9))
    # Nothing left in the workers' temporary folder (TMPDIR): not the killed worker's
    # scratch checkpoints, nor the launcher's own folder.
    assert leftovers(tmp_path) == [], leftovers(tmp_path)
    print(stderr)


def leftovers(tmp: Path) -> list[str]:
    """What a run left in TMPDIR (`tmp`), besides the test's own folders, each with its files."""
    return sorted(f"{p.name} ({sum(1 for f in p.rglob('*') if f.is_file())} files)"
                  for p in tmp.iterdir() if p.name not in ("out", "home"))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="requires Linux (prctl)")
def test_mgpu_run_workers_die_with_their_launcher(tmp_path: Path) -> None:
    script = tmp_path / "linger.py"
    script.write_text(textwrap.dedent(LINGERING))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run", "--workers", "2", "--max-restarts", "3",
         str(script)],
        cwd=tmp_path, env=launcher_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )
    pids: list[int] = []
    try:
        assert launcher.stdout is not None
        for _ in range(2):  # each worker's "pid N" line, once TensorFlow has started
            pids.append(int(launcher.stdout.readline().split()[-1]))
        assert sorted(workers_of(launcher.pid).values()) == sorted(pids)
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if alive(pid)] == []
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
