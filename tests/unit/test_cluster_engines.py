"""The cluster decided from each engine's environment: TF_CONFIG, WORKER_HOSTS, Slurm's
srun step, a Kubernetes Indexed Job; the order between them; each engine's bad input; a
task's GPUs on a node shared with other tasks; the peer probes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import Settings, SettingsErrors
from mgpu_env.hardware.nvml import GpuInfo, Probed
from mgpu_env.runtime.cluster import decide_cluster
from mgpu_env.runtime.cluster.model import Cluster
from mgpu_env.runtime.cluster.peers import (
    PeerStatus,
    explain,
    probe_peers,
    wait_until_resolved,
)
from tests.support.cli_process import clean_env
from tests.support.runtimes import runtime_of


def settings_from(**env: str) -> Settings:
    return resolve_settings({}, env).settings


def slurm_step(procid: int, ntasks: int, nodelist: str, tasks_per_node: str,
               localid: int, **extra: str) -> dict[str, str]:
    """The variables srun gives one task of a step (Slurm 22.05's names)."""
    return {
        "SLURM_JOB_ID": "42", "SLURM_PROCID": str(procid), "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_LOCALID": str(localid), **extra,
    }


def indexed_pod(index: int, workers: int = 3, **extra: str) -> dict[str, str]:
    """What k8s/indexed-job.yaml gives pod `index` (Kubernetes adds JOB_COMPLETION_INDEX)."""
    return {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": str(index),
        "K8S_JOB_NAME": "mgpu-train", "K8S_SERVICE": "mgpu-workers",
        "K8S_WORKERS": str(workers), **extra,
    }


def decide(environ: Mapping[str, str], **settings: str) -> tuple[dict | None, tuple[str, ...]]:
    decision = decide_cluster(settings_from(**settings), environ)
    described = decision.cluster.describe() if decision.cluster is not None else None
    return described, decision.notes


# ------------------------------------------------------------------------------ Slurm


def test_slurm_hostlists_keep_zero_padding_and_ranks_fill_nodes_in_order() -> None:
    # 2 tasks on each of gpu009..gpu011, 1 on dgx7: rank 3 is gpu010's second task.
    cluster, notes = decide(slurm_step(3, 7, "gpu[009-011],dgx7", "2(x3),1", 1))
    assert cluster == {
        "engine": "slurm",
        "workers": ["gpu009:2222", "gpu009:2223", "gpu010:2222", "gpu010:2223",
                    "gpu011:2222", "gpu011:2223", "dgx7:2222"],
        "index": 3, "chief": False,
    }
    assert notes == ()


def test_slurm_rank_zero_is_the_chief_and_worker_port_is_the_base() -> None:
    cluster, _ = decide(slurm_step(0, 2, "n[1-2]", "1(x2)", 0), WORKER_PORT="12345")
    assert cluster is not None
    assert cluster["chief"] and cluster["workers"] == ["n1:12345", "n2:12345"]


def test_a_slurm_step_of_one_task_and_a_batch_script_are_one_process() -> None:
    assert decide(slurm_step(0, 1, "n1", "1", 0)) == (None, ())
    # The batch script itself: SLURM_PROCID and the allocation's SLURM_NTASKS, no step.
    cluster, notes = decide({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert cluster is None
    assert len(notes) == 1 and "srun mgpu" in notes[0] and "4 tasks" in notes[0]


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        (slurm_step(2, 2, "n[1-2]", "1(x2)", 0), "SLURM_PROCID=2 is not below"),
        (slurm_step(0, 3, "n[1-2]", "1(x2)", 0), "add up to 2, not SLURM_STEP_NUM_TASKS=3"),
        (slurm_step(0, 2, "n[1-2]", "2", 0), "2 node(s) in SLURM_STEP_NODELIST but 1 count"),
        (slurm_step(0, 2, "n[1-2", "1(x2)", 0), "a hostlist does not parse"),
        (slurm_step(0, 2, "n1", "2", 1), "not local task 0 of node 0"),
        (slurm_step(1, 2, "n[1-2]", "1(x2)", 0, SLURM_NODEID="0"), "not local task 0 of node 1"),
        ({**slurm_step(0, 2, "n1", "2", 0), "SLURM_STEP_NUM_TASKS": "x"},
         "SLURM_STEP_NUM_TASKS='x' is not a whole number"),
        # isdigit passes '²' and 5,000 digits; int() refuses both.
        ({**slurm_step(0, 2, "n1", "2", 0), "SLURM_STEP_NUM_TASKS": "\u00b2"},
         "SLURM_STEP_NUM_TASKS='\u00b2' is not a whole number"),
        ({**slurm_step(0, 2, "n1", "2", 0), "SLURM_PROCID": "9" * 5000}, "(5,000 characters)"),
    ],
)
def test_contradictory_slurm_variables_are_a_clear_error(
    environ: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        decide_cluster(settings_from(), environ)
    message = str(caught.value)
    assert says in message and "Fix:" in message and "SLURM_STEP_NODELIST=" in message


def test_a_port_base_that_overflows_with_the_node_tasks_is_refused() -> None:
    overflow = r"(?s)needs ports up to 65537.*WORKER_PORT from 1024 to 65532"
    with pytest.raises(ConfigError, match=overflow):
        decide_cluster(settings_from(WORKER_PORT="65534"),
                       slurm_step(0, 4, "n1", "4", 0))
    with pytest.raises(SettingsErrors, match="WORKER_PORT"):
        settings_from(WORKER_PORT="70000")


# ------------------------------------------------------------------------ Kubernetes


def test_each_pod_of_an_indexed_job_sees_the_same_workers_and_its_own_index() -> None:
    seen = [decide(indexed_pod(i))[0] for i in range(3)]
    workers = [f"mgpu-train-{i}.mgpu-workers:2222" for i in range(3)]
    assert seen == [
        {"engine": "kubernetes", "workers": workers, "index": i, "chief": i == 0}
        for i in range(3)
    ]


def test_an_indexed_job_of_one_pod_or_without_the_manifest_variables_is_one_process() -> None:
    assert decide(indexed_pod(0, workers=1)) == (None, ())
    cluster, notes = decide({"JOB_COMPLETION_INDEX": "0"})
    assert cluster is None and "k8s/indexed-job.yaml" in notes[0]


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        (indexed_pod(3, workers=3), "JOB_COMPLETION_INDEX=3 but K8S_WORKERS=3"),
        (indexed_pod(0, K8S_WORKERS="two"), "K8S_WORKERS='two' is not a number"),
        (indexed_pod(0, K8S_WORKERS="\u00b3"), "K8S_WORKERS='\u00b3' is not a number"),
        ({**indexed_pod(0), "JOB_COMPLETION_INDEX": "\u00b9"}, "JOB_COMPLETION_INDEX=\u00b9 but"),
        ({**indexed_pod(0), "K8S_SERVICE": ""}, "has JOB_COMPLETION_INDEX but no K8S_SERVICE"),
    ],
)
def test_bad_indexed_job_variables_are_a_clear_error(environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match="Fix:") as caught:
        decide_cluster(settings_from(), environ)
    assert says in str(caught.value)


# -------------------------------------------------------------------------- the order


def test_explicit_settings_win_over_the_engines_with_a_note() -> None:
    environ = {**slurm_step(1, 2, "n[1-2]", "1(x2)", 0), **indexed_pod(2)}
    cluster, notes = decide(environ, WORKER_HOSTS="a:1,b:1", WORKER_INDEX="0")
    assert cluster == {"engine": "worker_hosts", "workers": ["a:1", "b:1"], "index": 0,
                       "chief": True}
    assert len(notes) == 2 and "Slurm's step variables are not used" in notes[0]
    config = json.dumps({"cluster": {"worker": ["x:1", "y:1"]},
                         "task": {"type": "worker", "index": 1}})
    assert decide(environ, TF_CONFIG=config)[0]["engine"] == "tf_config"  # type: ignore[index]


def test_slurm_wins_over_kubernetes() -> None:
    environ = {**slurm_step(1, 2, "n[1-2]", "1(x2)", 0), **indexed_pod(2)}
    assert decide(environ)[0]["engine"] == "slurm"  # type: ignore[index]


def test_the_tf_config_the_tfjob_operator_writes_is_understood() -> None:
    # Lower-case replica types, "master" as the chief in older jobs, and its extra keys.
    operator = {
        "cluster": {"master": ["job-master-0.ns.svc:2222"],
                    "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]},
        "task": {"type": "worker", "index": 1}, "environment": "cloud",
    }
    runtime = runtime_of({"TF_CONFIG": json.dumps(operator)})
    assert runtime.cluster_description() == {
        "engine": "tf_config",
        "workers": ["job-master-0.ns.svc:2222", "job-worker-0.ns.svc:2222",
                    "job-worker-1.ns.svc:2222"],
        "index": 2, "chief": False,
    }
    # TensorFlow is given "chief", the only leader MultiWorkerMirroredStrategy takes.
    assert json.loads(runtime.environment["TF_CONFIG"])["cluster"]["chief"] == [
        "job-master-0.ns.svc:2222"]
    master = {**operator, "task": {"type": "master", "index": 0}}
    assert runtime_of({"TF_CONFIG": json.dumps(master)}).role.is_chief
    both = {"cluster": {"chief": ["c:1"], "master": ["m:1"]}, "task": {"type": "chief",
                                                                       "index": 0}}
    with pytest.raises(SettingsErrors, match="both a \"chief\" and a \"master\""):
        settings_from(TF_CONFIG=json.dumps(both))


# ------------------------------------------------------- a task's share of the GPUs


def gpus(count: int) -> list[GpuInfo]:
    return [GpuInfo(i, "NVIDIA H100", f"GPU-{i}", compute_capability=Probed((9, 0)))
            for i in range(count)]


def test_one_task_per_node_uses_every_gpu_and_one_task_per_gpu_gets_its_local_id() -> None:
    whole = runtime_of({}, gpus(4), slurm_step(0, 2, "n[1-2]", "1(x2)", 0))
    assert whole.selection.cuda_visible_devices == "0,1,2,3"
    one_each = runtime_of({}, gpus(4), slurm_step(6, 8, "n[1-2]", "4(x2)", 2))
    assert one_each.selection.cuda_visible_devices == "2"
    assert one_each.environment["CUDA_VISIBLE_DEVICES"] == "2"
    assert "task 2 of 4 on this machine uses GPU(s) 2" in " ".join(one_each.notes)
    assert one_each.cluster_line() == (
        "Slurm: worker 6 of 8 (n2:2224; writes nothing); 4 tasks on this node, this one "
        "with 1 GPU(s)")
    assert whole.cluster_line() == (
        "Slurm: worker 0 of 2 (n1:2222; the chief, writes the run); one task on this node, "
        "with 4 GPU(s)")
    pairs = runtime_of({}, gpus(8), slurm_step(1, 4, "n1", "4", 1))
    assert pairs.selection.cuda_visible_devices == "2,3"


def test_a_device_list_slurm_already_narrowed_to_the_task_is_kept() -> None:
    environ = slurm_step(1, 2, "n1", "2", 1, CUDA_VISIBLE_DEVICES="1")
    runtime = runtime_of({}, gpus(2), environ)
    assert [g.index for g in runtime.selection.gpus] == [1]
    assert "narrowed to this task's 1 GPU(s) by the scheduler" in " ".join(runtime.notes)


def test_more_tasks_than_gpus_on_a_node_is_refused() -> None:
    with pytest.raises(SettingsErrors, match="4 tasks run on this machine but 2 GPU"):
        runtime_of({}, gpus(2), slurm_step(0, 4, "n1", "4", 0))


def test_the_cpu_is_shared_by_the_tasks_of_a_node() -> None:
    runtime = runtime_of({}, (), slurm_step(1, 2, "n1", "2", 1))
    assert runtime.role.num_workers == 2 and not runtime.selection.gpus


# ---------------------------------------------------------------------------- peers


def test_peer_probes_tell_an_unresolved_name_from_a_closed_and_an_open_port() -> None:
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: the kernel refuses
        open_port, closed_port = listening.getsockname()[1], closed.getsockname()[1]
        statuses = probe_peers(
            ["me:1", f"127.0.0.1:{open_port}", f"127.0.0.1:{closed_port}",
             "no-such-host.invalid:1"], "me:1", timeout=1.0)
    assert [s.state for s in statuses] == ["self", "ok", "refused", "unresolved"]
    lines = explain(statuses, "kubernetes", "WORKER_PORT")
    assert len(lines) == 2
    assert "nothing listens on the port yet" in lines[0]
    assert "no-such-host.invalid does not resolve" in lines[1] and "headless Service" in lines[1]
    silent = explain([PeerStatus("10.0.0.9:2222", "silent", "10.0.0.9")], "slurm", "WORKER_PORT")
    assert "firewall" in silent[0]


def test_waiting_for_peers_to_resolve_is_bounded_and_names_the_missing() -> None:
    clock = [0.0]
    appear_at = {"a": 0.0, "b": 5.0, "c": 1e9}

    def resolver(host: str) -> str | None:
        return "10.0.0.1" if clock[0] >= appear_at[host] else None

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    three = Cluster({"worker": ("a:1", "b:1", "c:1")}, "worker", 0, "tf_config")
    missing = wait_until_resolved(three, 30.0, resolver=resolver, sleep=sleep,
                                  clock=lambda: clock[0])
    assert missing == ["c"] and 30.0 <= clock[0] < 33.0
    clock[0] = 0.0
    two = Cluster({"worker": ("a:1", "b:1")}, "worker", 0, "tf_config")
    assert wait_until_resolved(two, 30.0, resolver=resolver, sleep=sleep,
                               clock=lambda: clock[0]) == []


# ------------------------------------------------------- the command, as an engine runs it


def dry_run_json(tmp_path: Path, environ: Mapping[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "entrypoint", "train", "--dry-run", "--json"],
        env=clean_env(tmp_path, DATASET="digits", GPUS="none", **environ), cwd=tmp_path,
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_mgpu_train_reports_the_cluster_each_pod_of_the_indexed_job_gets(tmp_path: Path) -> None:
    plans = [dry_run_json(tmp_path, indexed_pod(i, workers=2)) for i in range(2)]
    workers = ["mgpu-train-0.mgpu-workers:2222", "mgpu-train-1.mgpu-workers:2222"]
    assert [p["cluster"] for p in plans] == [
        {"engine": "kubernetes", "workers": workers, "index": 0, "chief": True},
        {"engine": "kubernetes", "workers": workers, "index": 1, "chief": False},
    ]
    assert all(p["replicas"] == 2 and p["strategy"] == "multi_worker" for p in plans)
    # The names only exist inside the cluster: a dry run says so instead of waiting.
    assert any("do not resolve yet" in note for note in plans[1]["notes"])


def test_mgpu_train_reports_the_cluster_of_a_tfjob_pod(tmp_path: Path) -> None:
    operator = {"cluster": {"chief": ["j-chief-0.ns.svc:2222"],
                            "worker": ["j-worker-0.ns.svc:2222"]},
                "task": {"type": "chief", "index": 0}, "environment": "cloud"}
    plan = dry_run_json(tmp_path, {"TF_CONFIG": json.dumps(operator)})
    assert plan["cluster"] == {"engine": "tf_config",
                               "workers": ["j-chief-0.ns.svc:2222", "j-worker-0.ns.svc:2222"],
                               "index": 0, "chief": True}


def test_one_process_has_no_cluster_in_the_json(tmp_path: Path) -> None:
    assert dry_run_json(tmp_path, {})["cluster"] is None


def test_every_line_of_a_worker_says_which_worker_wrote_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "entrypoint", "train", "--dry-run"],
        env=clean_env(tmp_path, DATASET="digits", GPUS="none",
                      **slurm_step(1, 2, "localhost", "2", 1)),
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) > 5 and all(line.startswith("[worker 1] ") for line in lines)
    assert ("[worker 1]   cluster        Slurm: worker 1 of 2 (localhost:2223; writes nothing); "
            "2 tasks on this node, this one with the CPU") in done.stdout
