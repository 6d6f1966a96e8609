"""The corpus of public scripts (tests/keras2_scripts/): each one's stand-in data, what
KERAS=auto gives it, and how to run it under `mgpu run` on 2 logical CPUs. Used by
tests/processes/test_keras2_scripts.py and tests/keras2_scripts/measure.py."""

from __future__ import annotations

import gzip
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.support.children import REPO
from tests.support.run_process import start

CORPUS = REPO / "tests" / "keras2_scripts"
OFFLINE = f"{REPO / 'tests' / 'tutorials' / 'offline'}:{CORPUS / 'offline'}:{REPO}"
RERUN_MARK = "Fix: rerun with Keras 2 (tf_keras): "
# What mgpu says ran for a script that fits outside every strategy's scope, and for a custom
# loop with no strategy (seen by its first gradient).
FIT_OUTSIDE_SCOPES = "TensorFlow's default strategy (one device, 1 replica): model.fit at"
LOOP_OUTSIDE_STRATEGIES = "none: the steps at"
# A script runs in about 2 minutes on 2 idle cores; several times that on a busy machine.
SCRIPT_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Script:
    name: str
    data: str  # "mnist" or "fashion_mnist"
    train: int  # stand-in samples
    test: int
    keras: str  # the Keras KERAS=auto gives it: "2" (the source scan) or "3"
    trains: bool  # True: exit 0 under KERAS=auto; False: ends with the KERAS=2 note
    done: str  # a line of its output that only its last step prints
    settings: tuple[tuple[str, str], ...] = ()  # beyond VIRTUAL_DEVICES=2
    says: str = ""  # a note mgpu must print on stderr
    # The strategy that ran, as mgpu's end line says it (observed at its first step); "":
    # none is said (it failed before its first step).
    ran: str = "MirroredStrategy on 2 devices (CPU:0, CPU:1), 2 replicas in sync"


SCRIPTS = [
    Script("tfdocs_custom_training.py", "fashion_mnist", 1536, 256, "2", True,
           "Accuracy after restoring the saved model without strategy"),
    # It splits the CPU in 2 itself: with 4 planned, MirroredStrategy() takes the 2 there are.
    Script("tfdocs_distributed_input.py", "none", 0, 0, "3", True, "PerReplica:{",
           (("VIRTUAL_DEVICES", "4"),), "TensorFlow lists 2 CPU device(s), not the 4 planned"),
    Script("tfdocs_distributed_keras.py", "mnist", 512, 256, "3", True, "Eval Accuracy"),
    # Its checkpoints are TensorFlow's (`ModelCheckpoint(checkpoint_prefix,
    # save_weights_only=True)`, the prefix a name bound to os.path.join(..., "ckpt_{epoch}")).
    Script("tfdocs_2023_distributed_keras.py", "mnist", 512, 256, "2", True, "Eval Accuracy"),
    Script("tfdocs_mixed_precision.py", "mnist", 60000, 10000, "2", True, "Epoch 4: loss=",
           ran=FIT_OUTSIDE_SCOPES),
    Script("tfdocs_save_and_load.py", "mnist", 1000, 1000, "3", True, "Restored model",
           ran=FIT_OUTSIDE_SCOPES),
    Script("tfdocs_2023_save_and_load.py", "mnist", 1000, 1000, "2", True,
           "Restored model, accuracy", ran=FIT_OUTSIDE_SCOPES),
    Script("tfdocs_quickstart_advanced.py", "mnist", 512, 256, "3", True, "Epoch 5, Loss",
           ran=LOOP_OUTSIDE_STRATEGIES),
    Script("tfdocs_2023_quickstart_advanced.py", "mnist", 512, 256, "2", True,
           "Epoch 5, Loss", ran=LOOP_OUTSIDE_STRATEGIES),
    # It compiles outside the strategy's scope: Keras 3 refuses at fit (the scan cannot tell),
    # before its first step, so nothing is said of a strategy that ran.
    Script("course_basic_mirrored_strategy.py", "mnist", 512, 256, "3", False, "Epoch 12/12",
           ran=""),
    Script("course_multi_gpu_mirrored_strategy.py", "fashion_mnist", 512, 256, "2", True,
           "Epoch 10, Loss"),
    # keras-io's 2020 guide: its checkpoints are SavedModel folders ("ckpt-{epoch}"), which
    # Keras 3 refuses when the callback is built, after the first fit; the second run
    # restores the first's checkpoint. 10000 of the samples are its validation set.
    Script("kerasio_2020_distributed_training.py", "mnist", 10512, 256, "2", True,
           "Restoring from ./ckpt/ckpt-1"),
    # keras-io's 2020 convnet example builds no strategy: its fit steps on TensorFlow's
    # default strategy, one device, whatever was planned.
    Script("kerasio_2020_mnist_convnet.py", "mnist", 512, 256, "3", True, "Test accuracy:",
           ran=FIT_OUTSIDE_SCOPES),
]


def stand_in(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Noise plus a bright row per label: learnable, so the loss falls as it would."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, samples).astype(np.uint8)
    images = rng.integers(0, 64, (samples, 28, 28)).astype(np.uint8)
    images[np.arange(samples), 2 + 2 * labels.astype(np.int64), :] = 255
    return images, labels


def write_mnist(home: Path, train: int, test: int) -> Path:
    path = home / ".keras" / "datasets" / "mnist.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    (x_train, y_train), (x_test, y_test) = stand_in(train, 0), stand_in(test, 1)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def write_fashion_mnist(home: Path, train: int, test: int) -> None:
    """The four IDX files Keras reads (labels: 8-byte header; images: 16-byte header)."""
    folder = home / ".keras" / "datasets" / "fashion-mnist"
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, (images, labels) in (("train", stand_in(train, 0)),
                                     ("t10k", stand_in(test, 1))):
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as out:
            out.write(struct.pack(">II", 2049, labels.size) + labels.tobytes())
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as out:
            out.write(struct.pack(">IIII", 2051, labels.size, 28, 28) + images.tobytes())


def run_script(tmp_path: Path, script: Script,
               **settings: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    environment = {"PYTHONPATH": OFFLINE, "QUIET": "0", "VIRTUAL_DEVICES": "2",
                   **dict(script.settings), **settings}
    if script.data == "mnist":
        environment["TUTORIAL_MNIST"] = str(write_mnist(home, script.train, script.test))
    elif script.data == "fashion_mnist":
        write_fashion_mnist(home, script.train, script.test)
    process = start(tmp_path, [str(CORPUS / script.name)], **environment)
    try:
        stdout, stderr = process.communicate(timeout=SCRIPT_TIMEOUT_S)
    finally:
        process.kill()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
