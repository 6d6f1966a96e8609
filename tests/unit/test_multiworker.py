"""Multi-worker pieces that need no cluster: cluster settings, agreement, faults, watchdog."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import Settings, SettingsErrors
from mgpu_env.runtime.cluster import Cluster, decide_cluster
from mgpu_env.training.multiworker import (
    Watchdog,
    WorkerSession,
    agreement_values,
    decode_values,
    encode_values,
    explain_worker_failure,
    find_disagreements,
    is_worker_failure,
    lost_tasks,
)
from tests.support.children import REPO
from tests.support.runtimes import runtime_of


def settings_from(**env: str) -> Settings:
    return resolve_settings({}, env).settings


def cluster_of(settings: Settings) -> Cluster | None:
    """The cluster the settings describe, with no scheduler's variables around them."""
    return decide_cluster(settings, {}).cluster


def tf_config(workers: list[str], index: int, chief: list[str] | None = None,
              task_type: str = "worker") -> str:
    cluster: dict[str, list[str]] = {"worker": workers}
    if chief is not None:
        cluster["chief"] = chief
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


# ------------------------------------------------------------------------------ settings


def test_no_cluster_settings_mean_one_process() -> None:
    assert cluster_of(settings_from()) is None
    runtime = runtime_of(settings_from())
    assert runtime.cluster is None and runtime.role.num_workers == 1
    assert "TF_CONFIG" not in runtime.environment


def test_worker_hosts_and_index_build_tf_config() -> None:
    runtime = runtime_of(settings_from(WORKER_HOSTS="w0:2222, w1:2222", WORKER_INDEX="1"))
    environ: dict[str, str] = {}
    runtime.apply(environ)
    role = runtime.role
    assert role is not None and role.num_workers == 2 and not role.is_chief
    assert json.loads(environ["TF_CONFIG"]) == {
        "cluster": {"worker": ["w0:2222", "w1:2222"]},
        "task": {"type": "worker", "index": 1},
    }


def test_worker_zero_is_the_chief_without_a_chief_job() -> None:
    cluster = cluster_of(settings_from(WORKER_HOSTS="a:1,b:2", WORKER_INDEX="0"))
    assert cluster is not None and cluster.role.is_chief and cluster.name == "worker 0 (a:1)"


def test_tf_config_with_a_chief_job() -> None:
    config = tf_config(["w0:1", "w1:1"], 0, chief=["c:1"])
    worker = cluster_of(settings_from(TF_CONFIG=config))
    assert worker is not None and worker.num_workers == 3 and not worker.role.is_chief
    chief = cluster_of(
        settings_from(TF_CONFIG=tf_config(["w0:1", "w1:1"], 0, ["c:1"], "chief"))
    )
    assert chief is not None and chief.role.is_chief and chief.address == "c:1"


def test_tf_config_from_the_env_file_is_exported_for_tensorflow(tmp_path: Path) -> None:
    env_file = tmp_path / "settings.env"
    config = tf_config(["127.0.0.1:1", "127.0.0.1:2"], 1)
    env_file.write_text(f"TF_CONFIG='{config}'\n")
    environ: dict[str, str] = {}
    runtime_of(resolve_settings({}, {"ENV_FILE": str(env_file)})).apply(environ)
    assert json.loads(environ["TF_CONFIG"]) == json.loads(config)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ('{"task": {}}', 'no "cluster"'),
        ('{"cluster": {"ps": ["a:1"], "worker": ["b:1"]}}', '"ps" job'),
        ('{"cluster": {"worker": []}}', "non-empty list"),
        ('{"cluster": {"worker": ["nohost"]}}', "not host:port"),
        ('{"cluster": {"worker": ["a:1"]}}', 'no "task"'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}',
         "not a job"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}',
         "not 0..0"),
    ],
)
def test_bad_tf_config_is_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(SettingsErrors) as caught:
        resolve_settings({}, {"TF_CONFIG": text})
    message = caught.value.errors[0]
    assert message.startswith("Bad setting TF_CONFIG=") and reason in message
    assert "Valid: empty, or JSON like" in message


@pytest.mark.parametrize(
    ("hosts", "reason"),
    [("a:1,,b:2", "empty item"), ("a:1,a:1", "listed twice"), ("a:0", "not host:port"),
     ("a", "not host:port"), (":80", "not host:port")],
)
def test_bad_worker_hosts_are_refused(hosts: str, reason: str) -> None:
    with pytest.raises(SettingsErrors, match=reason):
        resolve_settings({}, {"WORKER_HOSTS": hosts})


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"WORKER_HOSTS": "a:1,b:1"}, "WORKER_INDEX is not set"),
        ({"WORKER_INDEX": "0"}, "WORKER_HOSTS is empty"),
        ({"WORKER_HOSTS": "a:1,b:1", "WORKER_INDEX": "2"}, r"Valid: 0\.\.1"),
        ({"WORKER_HOSTS": "a:1", "WORKER_INDEX": "0",
          "TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'},
         "Both TF_CONFIG and WORKER_HOSTS"),
    ],
)
def test_cluster_settings_that_do_not_fit_together(env: dict[str, str], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:
        cluster_of(settings_from(**env))
    assert "Fix:" in str(caught.value) and caught.value.exit_code == 2


def test_a_single_process_runtime_sets_no_tf_config() -> None:
    environ = {"OTHER": "1"}
    runtime_of(settings_from(), environ=environ).apply(environ)
    assert "TF_CONFIG" not in environ and environ["OTHER"] == "1"


def test_cluster_round_trips_through_tf_config() -> None:
    cluster = Cluster({"chief": ("c:1",), "worker": ("w:1",)}, "worker", 0, "tf_config")
    again = cluster_of(settings_from(TF_CONFIG=cluster.tf_config()))
    assert again == Cluster({"chief": ("c:1",), "worker": ("w:1",)}, "worker", 0, "tf_config")


# ---------------------------------------------------------------------------- agreement


def test_values_survive_the_byte_encoding() -> None:
    values = {"BATCH_SIZE": "64", "DATASET": "digits", "LEARNING_RATE": "0.001"}
    row = encode_values(values, width=16)
    assert len(row) == 3 * 16 and all(0 <= b < 256 for b in row)
    assert decode_values(list(values), row, width=16) == values


def test_long_values_are_compared_by_digest() -> None:
    long_a, long_b = "x" * 100 + "a", "x" * 100 + "b"
    row_a = encode_values({"K": long_a}, width=32)
    row_b = encode_values({"K": long_b}, width=32)
    assert row_a != row_b and len(row_a) == 32


def test_disagreements_name_the_worker_and_both_values() -> None:
    keys = ["BATCH_SIZE", "EPOCHS"]
    rows = {
        0: encode_values({"BATCH_SIZE": "64", "EPOCHS": "5"}),
        1: encode_values({"BATCH_SIZE": "64", "EPOCHS": "5"}),
        2: encode_values({"BATCH_SIZE": "32", "EPOCHS": "5"}),
    }
    names = {0: "worker 0", 1: "worker 1", 2: "worker 2"}
    assert find_disagreements(keys, rows, names) == [
        "worker 2: BATCH_SIZE=32 there but 64 on worker 0"
    ]
    assert find_disagreements(keys, {k: rows[0] for k in rows}, names) == []


def test_agreement_compares_what_the_workers_resolved() -> None:
    values = agreement_values(
        settings_from(BATCH_SIZE="32", MIXED_PRECISION="1"),
        {"DATASET": "digits", "MIXED_PRECISION": "mixed_bfloat16", "KERAS": "2"},
        local_replicas=2, train_samples=1437, steps_per_epoch=22,
    )
    assert values["BATCH_SIZE"] == "32" and values["MIXED_PRECISION"] == "mixed_bfloat16"
    assert values["DATASET"] == "digits" and values["EPOCHS"] == "5"
    assert values["local replicas (GPUs or VIRTUAL_DEVICES)"] == "2"
    assert values["KERAS"] == "2" and values["XLA"] == "0" and values["LEARNING_RATE"] == "0.001"


# ------------------------------------------------------------------------------- faults


class UnavailableError(Exception):
    """Stands in for tf.errors.UnavailableError (the check goes by the class name)."""


HEARTBEAT_ERROR = (
    "Graph execution error:\n"
    "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/"
    "device:CPU:0}} Collective ops is aborted by: Error reported from /job:worker/task:1: "
    "The following tasks are unhealthy (stopped sending heartbeats):\n"
    "/job:worker/replica:0/task:1\nThe tasks have crashed."
)
RESET_ERROR = (
    "Collective ops is aborted by: recvmsg:Connection reset by peer\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:0 "
    "while calling /tensorflow.WorkerService/RecvBuf:"
)


def test_lost_worker_errors_are_recognised() -> None:
    assert is_worker_failure(UnavailableError(HEARTBEAT_ERROR))
    assert is_worker_failure(UnavailableError(RESET_ERROR))
    assert not is_worker_failure(UnavailableError("some other failure"))
    assert not is_worker_failure(ValueError(HEARTBEAT_ERROR))


def test_the_message_names_the_lost_worker() -> None:
    message = explain_worker_failure(
        UnavailableError(HEARTBEAT_ERROR), "worker 0 (h:1)", ("worker", 0)
    )
    first, tensorflow, fix = message.splitlines()
    assert first == "Worker 1 stopped or cannot be reached, so worker 0 (h:1) stops too."
    assert "unhealthy" in tensorflow and "function_node" not in tensorflow
    assert "start every worker again" in fix
    reset = explain_worker_failure(UnavailableError(RESET_ERROR), "worker 1", ("worker", 1))
    assert reset.startswith("Worker 0 stopped") and "Connection reset by peer" in reset


def test_lost_tasks_skip_this_worker() -> None:
    assert lost_tasks(HEARTBEAT_ERROR, ("worker", 0)) == ["worker 1"]
    assert lost_tasks("/job:chief/replica:0/task:0 and /job:worker/task:3") == [
        "chief 0", "worker 3"
    ]


def test_a_single_process_session_does_nothing(tmp_path: Path) -> None:
    session = WorkerSession(None, settings_from().worker_timeout)
    session.join()
    session.after_strategy(object(), {})
    session.share_restored(object(), [])
    session.progress("training")
    assert session.checkpoint_dir(tmp_path) == tmp_path
    assert session.failure(UnavailableError(HEARTBEAT_ERROR)) is None
    session.close(succeeded=True)


def test_a_non_chief_session_checkpoints_to_a_scratch_folder_it_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    settings = settings_from(WORKER_HOSTS="a:1,b:1", WORKER_INDEX="1")
    cluster = cluster_of(settings)
    assert cluster is not None
    session = WorkerSession(cluster, settings.worker_timeout)
    scratch = session.checkpoint_dir(tmp_path / "chief")
    assert scratch.parent == tmp_path and scratch.is_dir() and "worker1" in scratch.name
    message = session.failure(UnavailableError(HEARTBEAT_ERROR))
    assert message is not None and "so worker 1 (b:1) stops too" in message
    session.close(succeeded=False)
    assert not scratch.exists()


# ----------------------------------------------------------------------------- watchdog


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def expiring_watchdog(timeout_s: float) -> tuple[Watchdog, FakeClock, list[str], threading.Event]:
    clock = FakeClock()
    messages: list[str] = []
    fired = threading.Event()

    def on_expire(message: str) -> None:
        messages.append(message)
        fired.set()

    dog = Watchdog(timeout_s, "worker 1 (h:1)", on_expire, clock=clock, poll_s=0.01,
                   backstop=False)
    return dog, clock, messages, fired


def test_watchdog_fires_once_when_no_progress_comes() -> None:
    dog, clock, messages, fired = expiring_watchdog(30)
    with dog:
        dog.start("waiting for the other workers to join (h:2)")
        clock.now += 31
        assert fired.wait(5)
    assert len(messages) == 1 and dog.expired
    assert messages[0].startswith("worker 1 (h:1): no progress for 30 s while waiting for")
    assert "WORKER_TIMEOUT" in messages[0]


def test_watchdog_progress_pushes_the_deadline_back() -> None:
    dog, clock, messages, fired = expiring_watchdog(30)
    with dog:
        dog.start("training")
        for _ in range(5):
            clock.now += 20
            dog.progress()
            assert not fired.wait(0.05)
        dog.progress("saving the checkpoint")
        clock.now += 31
        assert fired.wait(5)
    assert "while saving the checkpoint" in messages[0]


def test_stopped_watchdog_never_fires() -> None:
    dog, clock, messages, fired = expiring_watchdog(30)
    dog.start("training")
    dog.stop()
    clock.now += 100
    assert not fired.wait(0.1) and messages == []


# ------------------------------------------------------------------- compose and TFJob

# PYTHONPATH: the mounted code (src/) imports as from its folder (MODEL=models:build).
NOT_SETTINGS = {"MGPU_DEBUG", "NCCL_DEBUG", "TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH"}


def test_the_compose_file_passes_real_settings_and_flags() -> None:
    from mgpu_env.config.settings import BY_ENV

    text = (REPO / "docker-compose.multiworker.yml").read_text()
    passed = set(re.findall(r"^\s+- ([A-Z][A-Z0-9_]+)(?:=|$)", text, re.M))
    assert {"WORKER_HOSTS", "WORKER_TIMEOUT", "EPOCHS", "BATCH_SIZE", "RUN_NAME"} <= passed
    assert passed - NOT_SETTINGS <= set(BY_ENV), passed - NOT_SETTINGS - set(BY_ENV)
    commands = re.findall(r'command: \["train", "--worker-index", "(\d)"\]', text)
    assert commands == ["0", "1"] and BY_ENV["WORKER_INDEX"].flag == "--worker-index"
    assert "worker0:2222,worker1:2222" in text
    assert "ports:" not in text  # nothing published on the host


def test_the_tfjob_manifest_sets_only_real_settings() -> None:
    from mgpu_env.config.settings import BY_ENV

    text = (REPO / "k8s" / "tfjob.yaml").read_text()
    names = set(re.findall(r"\{name: ([A-Z][A-Z0-9_]+), value:", text))
    assert names and names <= set(BY_ENV), names - set(BY_ENV)
    assert "TF_CONFIG" not in names and "WORKER_HOSTS" not in names  # the operator's job
    assert "kind: TFJob" in text and text.count("- name: tensorflow") == 2
    assert "Chief:" in text and "Worker:" in text and "containerPort: 2222" in text


def test_workers_on_the_cpu_do_not_split_it() -> None:
    # MultiWorkerMirroredStrategy uses one CPU device per worker whatever the split, so the
    # runtime counts one replica per worker (and says VIRTUAL_DEVICES is not used).
    runtime = runtime_of(settings_from(WORKER_HOSTS="a:1,b:1", WORKER_INDEX="0",
                                       VIRTUAL_DEVICES="2"))
    assert runtime.split.per_device == 1 and runtime.replicas == 2
    assert any("VIRTUAL_DEVICES=2 is not used" in note for note in runtime.notes)
