"""`mgpu run`, MODEL=/DATASET= hooks and the examples, end to end, in real processes.

Each run is its own process (the logical-device split and the precision policy are set once
per process). Scripts print one `SEEN {json}` line with what they saw; digits (built in,
offline) and one epoch keep the training runs short.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.children import REPO
from tests.support.run_process import (
    TIMEOUT_S,
    finish,
    mgpu,
    run_env,
    seen,
    start,
    write,
)
from tests.support.train_process import metrics, wait_for_epochs
from tests.support.workers import free_ports, log_of, two_workers, wait_all

pytestmark = pytest.mark.slow

# What a script under `mgpu run` sees of the run's decisions, before and after it builds
# strategies of its own.
PROBE = """\
import json, os, sys
first_line = {"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
              "name": __name__}
import keras
import tensorflow as tf
import mgpu_env
strategy = mgpu_env.strategy()
layer = keras.layers.Dense(2)
layer.build((None, 3))
first_line.update(
    api_replicas=strategy.num_replicas_in_sync,
    default_replicas=tf.distribute.MirroredStrategy().num_replicas_in_sync,
    policy=keras.mixed_precision.global_policy().name,
    layer_compute=layer.compute_dtype, layer_variables=layer.variable_dtype,
    global_batch=mgpu_env.global_batch_size(8), chief=mgpu_env.is_chief(),
    tf_config=os.environ.get("TF_CONFIG"), strategy=type(strategy).__name__,
)
print("SEEN " + json.dumps(first_line), flush=True)
"""


# ------------------------------------------------------------------------------ mgpu run


def test_the_script_sees_two_replicas_the_policy_its_argv_and_folder(tmp_path: Path) -> None:
    write(tmp_path, "code/probe.py", PROBE)
    result = mgpu(tmp_path, ["code/probe.py", "--epochs", "3", "-x"],
                  VIRTUAL_DEVICES="2", MIXED_PRECISION="bf16", QUIET="0")
    assert result.returncode == 0, result.stderr
    got = seen(result)
    assert got["argv"] == ["code/probe.py", "--epochs", "3", "-x"]
    assert got["name"] == "__main__"
    assert got["cwd"] == str(tmp_path)
    assert got["path0"] == str((tmp_path / "code").resolve())
    assert got["api_replicas"] == 2 and got["default_replicas"] == 2
    assert got["strategy"] == "MirroredStrategy"
    assert got["policy"] == "mixed_bfloat16"
    assert (got["layer_compute"], got["layer_variables"]) == ("bfloat16", "float32")
    assert got["global_batch"] == 16 and got["chief"] is True and got["tf_config"] is None
    assert "2 x logical CPU" in result.stderr  # the one-line summary, on stderr


@pytest.mark.parametrize(
    ("body", "code", "stderr"),
    [
        ("print('fine')", 0, None),
        ("import sys; sys.exit(3)", 3, None),
        ("def load():\n    raise FileNotFoundError('data.csv')\nload()", 1,
         "FileNotFoundError: data.csv"),
    ],
)
def test_the_scripts_exit_code_is_mgpus(
    tmp_path: Path, body: str, code: int, stderr: str | None
) -> None:
    write(tmp_path, "train.py", body + "\n")
    result = mgpu(tmp_path, ["train.py"])
    assert result.returncode == code, result.stderr
    if stderr is not None:
        # The script's own traceback, from its first frame; nothing of mgpu's.
        tail = result.stderr[result.stderr.index("Traceback (most recent call last):"):]
        assert 'File "train.py", line 3, in <module>' in tail and "in load" in tail
        assert tail.strip().endswith(stderr)
        assert "mgpu_env/launcher" not in tail and "runpy" not in tail and "--debug" not in tail


def test_dash_m_runs_a_module_with_its_arguments(tmp_path: Path) -> None:
    write(tmp_path, "userpkg/__init__.py", "")
    write(tmp_path, "userpkg/train.py", PROBE)
    result = mgpu(tmp_path, ["-m", "userpkg.train", "--lr", "0.1"], VIRTUAL_DEVICES="2")
    assert result.returncode == 0, result.stderr
    got = seen(result)
    assert got["argv"] == [str(tmp_path / "userpkg" / "train.py"), "--lr", "0.1"]
    assert got["path0"] == str(tmp_path) and got["api_replicas"] == 2


SIGNAL_SCRIPT = """\
import signal, sys, time
if "--handle" in sys.argv:
    def stop(signum, frame):
        print("SIGTERM handled by the script", flush=True)
        sys.exit(42)
    signal.signal(signal.SIGTERM, stop)
print("READY", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize(("args", "code"), [(["--handle"], 42), ([], -signal.SIGTERM)])
def test_sigterm_reaches_the_script(tmp_path: Path, args: list[str], code: int) -> None:
    write(tmp_path, "wait.py", SIGNAL_SCRIPT)
    process = start(tmp_path, ["wait.py", *args])
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "READY", process.communicate()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    # Handled: the script's handler runs and its exit code is mgpu's. Not handled: the
    # process dies of SIGTERM, exactly like `python wait.py` (no wrapper left behind).
    assert process.returncode == code, stderr
    assert ("SIGTERM handled by the script" in stdout) == bool(args)


MULTI_WORKER = """\
import json, os
import tensorflow as tf
import mgpu_env
strategy = mgpu_env.strategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print("SEEN " + json.dumps({
    "tf_config": os.environ.get("TF_CONFIG"),
    "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
    "replicas": strategy.num_replicas_in_sync, "global_batch": mgpu_env.global_batch_size(8),
    "chief": mgpu_env.is_chief(), "total": float(total)}), flush=True)
"""


def test_worker_hosts_gives_two_processes_one_cluster(tmp_path: Path) -> None:
    script = write(tmp_path, "mw.py", MULTI_WORKER)
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    workers = [start(tmp_path, [str(script)], WORKER_HOSTS=hosts, WORKER_INDEX=str(index),
                     WORKER_TIMEOUT="60") for index in (0, 1)]
    results = finish(workers)
    for index, result in enumerate(results):
        assert result.returncode == 0, result.stderr
        got = seen(result)
        config = json.loads(got["tf_config"])
        assert config["cluster"] == {"worker": hosts.split(",")}
        assert config["task"] == {"type": "worker", "index": index}
        assert got["multi_worker"] is True
        assert got["replicas"] == 2 and got["global_batch"] == 16
        assert got["chief"] is (index == 0)
        # One all-reduce over both processes' replicas: they form one cluster.
        assert got["total"] == 2.0


SEED_ON_DIGITS = """\
# The seed's own code, unmodified (its MirroredStrategy(), compile and model.fit), on the
# built-in digits because the seed's MNIST download is not available offline.
from mgpu_env.training.input.data import load_arrays, resolve_dataset
from mgpu_env.training import tutorial

arrays = load_arrays(resolve_dataset("digits", None), 42)
tutorial.train(arrays.x_train, arrays.y_train, epochs=1)
"""


def test_the_seeds_unmodified_script_trains_on_two_logical_devices(tmp_path: Path) -> None:
    write(tmp_path, "seed_digits.py", SEED_ON_DIGITS)
    result = mgpu(tmp_path, ["seed_digits.py"], VIRTUAL_DEVICES="2")
    assert result.returncode == 0, result.stderr
    assert "Number of devices: 2" in result.stdout
    plain = subprocess.run(
        [sys.executable, "seed_digits.py"], cwd=tmp_path, env=run_env(tmp_path),
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    # Without mgpu run, TensorFlow's own default: one device on a CPU.
    assert "Number of devices: 1" in plain.stdout, plain.stderr


# The real CLI in a fresh interpreter with two fake GPUs. TensorFlow here has no GPU, so
# the pre-flight and TensorFlow's device setup are left out; the script reports what a
# CUDA program would see.
FAKE_GPUS = """
import sys
sys.path.insert(0, {repo!r})
from tests.support.fake_nvml import fake_with
import mgpu_env.hardware.nvml as nvml
nvml.load_library = lambda: fake_with(2)
from mgpu_env import launcher
launcher.prepare = lambda runtime: None
from entrypoint.app import main
sys.argv = ["mgpu", "run", "show_gpus.py"]
main()
"""


def test_gpus_1_on_two_fake_gpus_gives_the_script_cuda_visible_devices_1(
    tmp_path: Path,
) -> None:
    write(tmp_path, "show_gpus.py", (
        "import json, os, sys\n"
        "print('SEEN ' + json.dumps({k: os.environ.get(k) for k in\n"
        "      ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')}), flush=True)\n"
        "print('tensorflow' in sys.modules)\n"
    ))
    result = subprocess.run(
        [sys.executable, "-c", FAKE_GPUS.format(repo=str(REPO))], cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "GPUS": "1"}, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert seen(result) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert "2 x GPU" not in result.stderr and "1 x GPU" in result.stderr


# ---------------------------------------------------------------------------- the hooks

HOOKS = {"MODEL": "examples.cnn_hook:build", "DATASET": "examples.cnn_hook:load_digits"}


def test_hooks_train_resume_after_kill_9_and_write_every_output(tmp_path: Path) -> None:
    output = tmp_path / "run"
    settings = {**HOOKS, "VIRTUAL_DEVICES": "2", "BATCH_SIZE": "32", "EPOCHS": "4",
                "OUTPUT_DIR": str(output)}
    process = start(tmp_path, [], "train", **settings)
    try:
        # Two epochs in history.json: the first one's checkpoint is certainly written.
        wait_for_epochs(output, process, 2)
        process.kill()  # kill -9
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGKILL

    result = mgpu(tmp_path, [], "train", **settings)
    assert result.returncode == 0, result.stderr
    assert "input (28, 28, 1), 10 classes" in result.stdout
    data = metrics(output)
    assert data["resumed_from_epoch"] >= 1 and data["epochs_completed"] == 4
    assert [e["epoch"] for e in data["history"]] == [1, 2, 3, 4]
    assert "resumes after epoch" in result.stdout
    assert data["replicas"] == 2 and data["dataset"] == HOOKS["DATASET"]
    assert data["settings"]["MODEL"] == HOOKS["MODEL"]
    assert data["test_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert (output / "logs").is_dir() and any((output / "logs").iterdir())

    # model.keras is the user's CNN.
    check = subprocess.run(
        [sys.executable, "-c",
         "import keras, sys; m = keras.models.load_model(sys.argv[1]); "
         "print(m.name, [type(x).__name__ for x in m.layers][2])", str(output / "model.keras")],
        env=run_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert check.stdout.split() == ["small_cnn", "Conv2D"], check.stderr


def test_sigterm_stops_a_hooked_run_at_a_step_and_it_resumes(tmp_path: Path) -> None:
    output = tmp_path / "run"
    settings = {**HOOKS, "EPOCHS": "200", "OUTPUT_DIR": str(output)}
    process = start(tmp_path, [], "train", **settings)
    try:
        wait_for_epochs(output, process, 2)
        process.send_signal(signal.SIGTERM)
        _stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "SIGTERM received" in stderr and "Traceback" not in stderr
    result = mgpu(tmp_path, ["--dry-run"], "train", **settings)
    assert result.returncode == 0, result.stderr
    assert "resumes after epoch" in result.stdout


def test_hooks_train_on_two_workers_and_only_the_chief_writes(tmp_path: Path) -> None:
    hooks = {**HOOKS, "PYTHONPATH": str(REPO)}
    with two_workers(tmp_path, w0=hooks, w1=hooks) as processes:
        codes = wait_all(tmp_path, processes)
    assert codes == [0, 0], log_of(tmp_path, 0)[-3000:] + log_of(tmp_path, 1)[-3000:]
    chief = metrics(tmp_path / "out0")
    assert chief["replicas"] == 2 and chief["settings"]["MODEL"] == HOOKS["MODEL"]
    assert chief["dataset"] == HOOKS["DATASET"] and chief["epochs_completed"] == 2
    assert (tmp_path / "out0" / "model.keras").is_file()
    assert not (tmp_path / "out1" / "model.keras").exists()


def test_a_builder_that_does_not_fit_the_data_exits_2(tmp_path: Path) -> None:
    write(tmp_path, "tiny_model.py", (
        "import keras\n"
        "def build(input_shape, num_classes):\n"
        "    return keras.Sequential([keras.Input(shape=(10,)), keras.layers.Dense(10)])\n"
    ))
    result = mgpu(tmp_path, [], "train", MODEL="tiny_model:build", DATASET="digits",
                  EPOCHS="1", OUTPUT_DIR=str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert "does not take the data's samples of shape (784,)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "model.keras").exists()


def test_bench_measures_the_model_builder(tmp_path: Path) -> None:
    output = tmp_path / "bench"
    result = mgpu(tmp_path, [], "bench", MODEL=HOOKS["MODEL"], VIRTUAL_DEVICES="2",
                  BATCH_SIZE="16", BENCH_WARMUP="2", BENCH_STEPS="3", BENCH_INTERVALS="2",
                  OUTPUT_DIR=str(output))
    assert result.returncode == 0, result.stderr
    data = json.loads((output / "bench.json").read_text())
    assert [p["replicas"] for p in data["points"]] == [1, 2]
    assert {p["model"] for p in data["points"]} == {HOOKS["MODEL"]}
    assert all(p["samples_per_s"]["median"] > 0 for p in data["points"])
    assert f"mgpu bench: {HOOKS['MODEL']}" in result.stdout


def test_bench_measures_the_builder_on_the_loaders_samples(tmp_path: Path) -> None:
    # The loader's 28x28x1 images give the model its shape on every point, synthetic too,
    # so the input's cost is measured on the same model.
    output = tmp_path / "bench"
    result = mgpu(tmp_path, [], "bench", **HOOKS, BENCH_DATA="all", BENCH_REPLICAS="1",
                  BATCH_SIZE="16", BENCH_WARMUP="2", BENCH_STEPS="3", BENCH_INTERVALS="2",
                  OUTPUT_DIR=str(output))
    assert result.returncode == 0, result.stderr
    data = json.loads((output / "bench.json").read_text())
    assert [p["data"] for p in data["points"]] == ["synthetic", "real", "stream"]
    assert all(p["samples_per_s"]["median"] > 0 for p in data["points"])
    sources = [p["worker"].get("data_source", "") for p in data["points"][1:]]
    assert all(f"{HOOKS['DATASET']} (your loader)" in source for source in sources)
    assert len(data["input_pipeline_cost"]) == 2


def test_bench_says_the_resnet_needs_images_when_the_loader_gives_rows(
    tmp_path: Path,
) -> None:
    (tmp_path / "row_data.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    x = np.random.default_rng(0).random((256, 30), dtype=np.float32)\n"
        "    y = np.arange(256) % 3\n"
        "    return (x[:200], y[:200]), (x[200:], y[200:])\n"
    )
    result = mgpu(tmp_path, [], "bench", DATASET="row_data:load", BENCH_MODEL="resnet",
                  BENCH_REPLICAS="1", BENCH_WARMUP="1", BENCH_STEPS="1", BENCH_INTERVALS="2",
                  OUTPUT_DIR=str(tmp_path / "bench"))
    assert result.returncode == 1, result.stderr
    assert "BENCH_MODEL=resnet takes images (height, width, channels)" in result.stderr
    assert "DATASET=row_data:load gives samples of shape (30,)" in result.stderr
    assert "Fix: BENCH_MODEL=mlp" in result.stderr and "Traceback" not in result.stderr


# -------------------------------------------------------------------------- the examples


def test_example_keras_fit_trains_with_backup_and_restore(tmp_path: Path) -> None:
    script = str(REPO / "examples" / "keras_fit.py")
    result = mgpu(tmp_path, [script, "--epochs", "1"], VIRTUAL_DEVICES="2", RUN_NAME="fit")
    assert result.returncode == 0, result.stderr
    assert "replicas: 2, global batch: 64" in result.stdout
    assert "test accuracy:" in result.stdout
    assert (tmp_path / "runs" / "fit" / "model.keras").is_file()


def test_example_custom_loop_trains_and_resumes(tmp_path: Path) -> None:
    script = str(REPO / "examples" / "custom_loop.py")
    result = mgpu(tmp_path, [script, "--epochs", "1"], VIRTUAL_DEVICES="2", RUN_NAME="loop")
    assert result.returncode == 0, result.stderr
    assert "epoch 1/1" in result.stdout
    again = mgpu(tmp_path, [script, "--epochs", "2"], VIRTUAL_DEVICES="2", RUN_NAME="loop")
    assert again.returncode == 0, again.stderr
    assert "resuming after epoch 1" in again.stdout and "epoch 2/2" in again.stdout
    assert "epoch 1/2" not in again.stdout


def test_plain_python_runs_the_example_with_the_same_settings(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "keras_fit.py"), "--epochs", "1"],
        cwd=tmp_path, env=run_env(tmp_path, VIRTUAL_DEVICES="2", RUN_NAME="plain"),
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert "replicas: 2, global batch: 64" in result.stdout


# -------------------------------------------------------------------------------- KERAS

POLICY_PROBE = """\
import json, sys
import tensorflow as tf
print("SEEN " + json.dumps({
    "policy": tf.keras.mixed_precision.global_policy().name,
    "tf_keras": tf.keras.__name__.startswith("tf_keras"),
    "keras_3_loaded": "keras" in sys.modules}), flush=True)
"""


def test_keras_2_gets_the_precision_policy_in_tf_keras(tmp_path: Path) -> None:
    write(tmp_path, "policy.py", POLICY_PROBE)
    result = mgpu(tmp_path, ["policy.py"], KERAS="2", MIXED_PRECISION="bf16", QUIET="0")
    assert result.returncode == 0, result.stderr
    assert seen(result) == {"policy": "mixed_bfloat16", "tf_keras": True,
                            "keras_3_loaded": False}
    assert "tf.keras Keras 2 (tf_keras)" in result.stderr


@pytest.mark.parametrize("keras", ["2", "3"])
def test_mgpu_trains_own_loop_trains_under_either_keras(tmp_path: Path, keras: str) -> None:
    result = mgpu(tmp_path, [], "train", KERAS=keras, DATASET="digits", EPOCHS="1",
                  MIXED_PRECISION="fp16", OUTPUT_DIR=str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert metrics(tmp_path / "out")["epochs_completed"] == 1


# ---------------------------------------------- the script's own devices and precision policy

OWN_SPLIT_AND_POLICY = """\
import json
import numpy as np
import tensorflow as tf
# As TensorFlow's distributed-input tutorial does: the script splits the CPU in 2 itself.
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
tf.keras.mixed_precision.set_global_policy("mixed_float16")
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD()
def step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.cast(model(x), tf.float32) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
strategy.run(tf.function(step), args=(np.ones((4, 4), "float32"),))
print("SEEN " + json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "devices": list(strategy.extended.worker_devices),
    "repr": repr(type(strategy)), "qualname": type(strategy).__qualname__}), flush=True)
"""


def test_a_script_that_splits_the_cpu_itself_gets_the_real_devices_and_its_policy_noted(
    tmp_path: Path,
) -> None:
    write(tmp_path, "own.py", OWN_SPLIT_AND_POLICY)
    result = mgpu(tmp_path, ["own.py"], VIRTUAL_DEVICES="4", QUIET="0")
    assert result.returncode == 0, result.stderr[-3000:]
    got = seen(result)
    # Never more replicas than devices: the 2 the script made, not the 4 planned.
    assert got["replicas"] == 2
    assert [device.rsplit("/", 1)[1] for device in got["devices"]] == [
        "device:CPU:0", "device:CPU:1"]
    assert "TensorFlow lists 2 CPU device(s), not the 4 planned" in result.stderr
    # It is named as TensorFlow names it, in reprs and tracebacks.
    assert got["qualname"] == "MirroredStrategy" and "<locals>" not in got["repr"]
    # What ran, observed: its strategy's step, the policy the script set itself (at its
    # line) and what its layer computed in, with the loss-scaling warning its loop needs.
    end = result.stderr.strip().splitlines()[-4:]
    assert end[0].startswith("mgpu run: strategy that ran: MirroredStrategy on 2 devices "
                             "(CPU:0, CPU:1), 2 replicas in sync: strategy.run at own.py:17;"
                             " the script's MirroredStrategy uses 2 devices"), end
    assert end[1] == "mgpu run: precision that ran: 1 Keras layer in float16 (mixed_float16)"
    assert end[2] == (
        "mgpu run: note: the script set its own precision policy (Keras 3 set_global_policy("
        "'mixed_float16') at own.py:7): the 1 Keras layer built after it computed in float16 "
        "(mixed_float16), not float32, which MIXED_PRECISION=0 planned"), end
    assert "own.py:16 calls apply_gradients with no LossScaleOptimizer" in end[3], end


# What a public script of the Keras 2 era does that the plan does not know: a strategy of
# its own (one replica), a SavedModel checkpoint it would write after training, and an error
# of its own at the end.
OWN_STRATEGY = """\
import sys
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("STEP 1 in sync:", strategy.num_replicas_in_sync, flush=True)
callback = tf.keras.callbacks.ModelCheckpoint(filepath="./ckpt/ckpt-{epoch}")
raise RuntimeError(f"the script's own error, after {callback.__class__.__name__}")
"""


def test_the_strategy_the_script_built_and_keras_2_chosen_before_its_first_step(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "own.py", OWN_STRATEGY)
    result = mgpu(tmp_path, [str(path), "--lr", "0.1"], VIRTUAL_DEVICES="2", QUIET="0")
    assert result.returncode == 1, result.stderr[-3000:]
    err = result.stderr
    # Before its first line: Keras 2, the line and why.
    assert "tf.keras Keras 2 (tf_keras)" in err.splitlines()[0], err[:2000]
    assert "  keras 2 code: `tf.keras.callbacks.ModelCheckpoint(filepath='./ckpt/ckpt-{epoch}')`"\
        " at own.py:5: Keras 3's ModelCheckpoint writes only .keras or .h5" in err, err[:3000]
    assert "STEP 1 in sync: 1" in result.stdout
    # Said when built, against the plan; it failed before any step: no advice about a
    # strategy that never ran, and its own error is the last line.
    built = ("mgpu run: strategy built: MultiWorkerMirroredStrategy on 1 device (CPU:0), "
             "1 replica in sync (VIRTUAL_DEVICES planned 2)")
    assert built in err and err.index(built) < err.index("Traceback")
    assert "strategy that ran" not in err and "Fix: use" not in err
    assert err.strip().splitlines()[-1] == ("RuntimeError: the script's own error, after "
                                             "ModelCheckpoint")


def test_any_error_of_tf_keras_code_under_default_keras_3_ends_with_the_keras_2_command(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "plain.py", "import tensorflow as tf\n"
                                       "model = tf.keras.Sequential([tf.keras.Input((2,))])\n"
                                       "raise KeyError('a wording no list holds')\n")
    result = mgpu(tmp_path, [str(path), "--data", "a b"], VIRTUAL_DEVICES="2")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mgpu run: note: the script is tf.keras code"), last
    assert last.endswith(f"KERAS=2 mgpu run {path} --data 'a b'"), last
    # It failed before any step: nothing about strategies.
    assert "strategy that ran" not in result.stderr
    # The same script importing Keras 3 itself: KERAS=2 would not change it, so no note.
    own = write(tmp_path, "own.py", "import keras\n" + path.read_text())
    result = mgpu(tmp_path, [str(own)], VIRTUAL_DEVICES="2")
    assert result.returncode == 1 and "KERAS=2" not in result.stderr, result.stderr[-2000:]
