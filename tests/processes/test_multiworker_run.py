"""Two `mgpu train` workers on 127.0.0.1: training together, a settings mismatch, a kill.

Each worker is its own process, as on two machines; WORKER_HOSTS lists two free loopback
ports picked here. The workers get separate OUTPUT_DIRs (nothing shared), so the tests also
show that only the chief writes outputs and that resuming needs no shared folder. Digits,
tiny batches and few epochs keep each run to seconds; every wait is bounded and every
process is killed in `finally`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runfolders import completed_epochs, epoch_losses
from tests.support.workers import (
    RUN_TIMEOUT_S,
    free_ports,
    log_of,
    two_workers,
    wait_all,
    worker_env,
)

pytestmark = pytest.mark.slow
# A dead worker is noticed by TensorFlow's coordination service (10 s heartbeat timeout) or
# at once (connection reset); WORKER_TIMEOUT below bounds every other wait.
SURVIVOR_EXIT_BOUND_S = 45


def test_two_workers_train_together_and_only_the_chief_writes(tmp_path: Path) -> None:
    verbose = {"QUIET": "0"}
    with two_workers(tmp_path, w0=verbose, w1=verbose) as processes:
        codes = wait_all(tmp_path, processes)
    assert codes == [0, 0], log_of(tmp_path, 0)[-3000:] + log_of(tmp_path, 1)[-3000:]
    chief = json.loads((tmp_path / "out0" / "metrics.json").read_text())
    assert chief["replicas"] == 2 and chief["global_batch_size"] == 32
    assert chief["epochs_completed"] == 2
    # One model, trained by both: the same loss after every epoch on each worker.
    losses = epoch_losses(log_of(tmp_path, 0))
    assert len(losses) == 2 and losses == epoch_losses(log_of(tmp_path, 1))
    assert f"{chief['history'][-1]['loss']:.4f}" == losses[-1]
    # Only the chief wrote outputs; the worker's scratch checkpoints are gone.
    for name in ("metrics.json", "model.keras", "history.json", "run.json", "logs",
                 "checkpoints"):
        assert (tmp_path / "out0" / name).exists(), name
    assert not (tmp_path / "out1").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_workers_with_different_settings_stop_and_say_which(tmp_path: Path) -> None:
    with two_workers(tmp_path, w1={"BATCH_SIZE": "8"}) as processes:
        codes = wait_all(tmp_path, processes)
    assert codes == [2, 2]
    for index in (0, 1):
        log = log_of(tmp_path, index)
        assert "The workers' settings differ" in log, log[-3000:]
        assert "worker 1: BATCH_SIZE=8 there but 16 on worker 0" in log
    assert not (tmp_path / "out0" / "checkpoints").exists()


def wait_for_two_epochs(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """Until the chief has checkpointed 2 epochs, with both workers still running."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while completed_epochs(tmp_path / "out0") < 2:
        assert all(p.poll() is None for p in processes), log_of(tmp_path, 0)[-3000:]
        assert time.monotonic() < deadline, "2 epochs did not complete in time"
        time.sleep(0.05)


@pytest.mark.parametrize("victim", [1, 0], ids=["kill-worker", "kill-chief"])
def test_a_killed_worker_stops_the_other_and_a_restart_resumes(
    tmp_path: Path, victim: int
) -> None:
    survivor = 1 - victim
    slow = {"EPOCHS": "40"}
    with two_workers(tmp_path, w0=slow, w1=slow) as processes:
        wait_for_two_epochs(tmp_path, processes)
        processes[victim].kill()
        killed = time.monotonic()
        try:
            processes[survivor].wait(timeout=SURVIVOR_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the survivor still runs {SURVIVOR_EXIT_BOUND_S} s after the kill")
        took = time.monotonic() - killed
    assert processes[survivor].returncode == 1
    message = log_of(tmp_path, survivor)
    assert f"Worker {victim} stopped or cannot be reached" in message, message[-3000:]
    assert "start every worker again" in message
    print(f"survivor exited {took:.1f} s after the kill")
    kept = completed_epochs(tmp_path / "out0")
    assert kept >= 2

    resume = {"EPOCHS": str(kept + 1)}
    with two_workers(tmp_path, w0=resume, w1=resume) as processes:
        codes = wait_all(tmp_path, processes)
    assert codes == [0, 0], log_of(tmp_path, 0)[-3000:] + log_of(tmp_path, 1)[-3000:]
    chief = json.loads((tmp_path / "out0" / "metrics.json").read_text())
    assert chief["resumed_from_epoch"] == kept and chief["epochs_completed"] == kept + 1
    assert [e["epoch"] for e in chief["history"]] == list(range(1, kept + 2))
    assert not (tmp_path / "out1").exists()


def test_a_worker_whose_peer_never_comes_stops_after_worker_timeout(tmp_path: Path) -> None:
    """The wait for the other workers holds the GIL; the faulthandler backstop ends it."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    log = (tmp_path / "worker0.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "train"],
        env=worker_env(tmp_path, hosts, 0, WORKER_TIMEOUT="8"),
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the lone worker still waits 90 s later, with WORKER_TIMEOUT=8")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
    output = log_of(tmp_path, 0)
    assert process.returncode == 1, output[-3000:]
    assert "[worker 0] worker 0 " in output and "waiting up to 8 s (WORKER_TIMEOUT)" in output
    assert "waited" in output and "for the other workers to join: worker 1" in output
    assert "Thread 0x" not in output


def test_sigterm_stops_every_worker_at_a_step_boundary(tmp_path: Path) -> None:
    """TensorFlow's own SIGTERM handler must not swallow `docker stop`'s signal."""
    slow = {"EPOCHS": "40"}
    with two_workers(tmp_path, w0=slow, w1=slow) as processes:
        wait_for_two_epochs(tmp_path, processes)
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=SURVIVOR_EXIT_BOUND_S)
    codes = [p.returncode for p in processes]
    # Both stop; one may notice the other's exit first (1) instead of its own signal.
    assert 143 in codes and set(codes) <= {143, 1}, codes
    assert completed_epochs(tmp_path / "out0") < 40


# `model.fit`'s metrics between workers, under tf_keras (KERAS=auto's choice for a script there).
# keras-team/keras#16304: tf_keras sums what each step returns over the workers, so the
# per-batch logs (progress bar, on_train_batch_end) read N times the truth; the launcher
# makes them the true values (`launcher._true_batch_metrics_between_workers`). Here each
# worker trains on its own targets (worker 0: 1, worker 1: 3; learning rate 0, so nothing
# moves): the true values over both are loss (1 + 9) / 2 = 5 and mae (1 + 3) / 2 = 2; a sum
# would say 10 and 4, a worker's own 1 or 9.
TRUE_METRICS = """\
import json, os
import numpy as np
import tensorflow as tf
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(1,)),
                                 tf.keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.0), loss="mse",
                  metrics=["mae"])
target = 1.0 if index == 0 else 3.0
data = tf.data.Dataset.from_tensor_slices(
    (np.ones((64, 1), "float32"), np.full((64, 1), target, "float32"))).repeat().batch(8)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
batches = []
record = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: batches.append(
        {name: round(float(value), 4) for name, value in logs.items()}))
history = model.fit(data.with_options(options), epochs=2, steps_per_epoch=3, verbose=1,
                    callbacks=[record])
print("SEEN " + json.dumps({"keras": tf.keras.__name__, "history": history.history,
                            "batches": batches,
                            "reduction": model.distribute_reduction_method}), flush=True)
"""


def test_model_fit_metrics_between_workers_are_the_true_values(tmp_path: Path) -> None:
    from tests.support.run_process import finish, seen, start, write

    write(tmp_path, "metrics.py", TRUE_METRICS)
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    (tmp_path / "tmp").mkdir()
    results = finish([
        start(tmp_path, ["metrics.py"], WORKER_HOSTS=hosts, WORKER_INDEX=str(index),
              WORKER_TIMEOUT="90", TMPDIR=str(tmp_path / "tmp"))
        for index in (0, 1)])
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        got = seen(result)
        assert got["keras"].startswith("tf_keras")
        assert got["history"] == {"loss": [5.0, 5.0], "mae": [2.0, 2.0]}, got
        assert got["batches"] == [{"loss": 5.0, "mae": 2.0}] * 6, got
        assert got["reduction"] == "first"
        # The progress bar prints the same values.
        assert "loss: 5.0000 - mae: 2.0000" in result.stdout.replace("\r", "\n")
