"""The losses of a run that loses one of its 4 devices and goes on with 3, against the run
that never lost one: `mgpu train --max-restarts` recovery at the same global batch.

    .venv/bin/python benchmarks/recovery_losses.py [--epochs 4] [--fault-step 150]
        [--batch-size 3] [--seed 7]

On the CPU: 4 logical devices (VIRTUAL_DEVICES=4) stand for 4 GPUs. The reference run
trains EPOCHS epochs of digits at BATCH_SIZE per replica (global batch 4 x BATCH_SIZE). The
other run is supervised (`recovery.supervise_run`, max_restarts=1): its MODEL
(tests/fixtures/recover/faultmodel.py) raises once, at its layer's 4 x `--fault-step`th
call (one a replica and step; the epoch's evaluation calls it too, so a little earlier
than that step): a crash as a lost GPU's CUDA error is; and the health check before the
restart reads a fake NVML (answering as pynvml does) in which GPU 2 has fallen off the
bus (NVML_ERROR_GPU_IS_LOST): the run resumes from its last checkpoint on 3 devices at the
same global batch.

Printed: each logged step's (epoch's) loss and accuracy of both runs and their absolute
difference, the max over them, the test loss and accuracy's, and the max absolute
difference of the final weights (model.keras). Not bitwise, by design: 3 replicas sum the
gradients in another order than 4.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mgpu_env.hardware import nvml
from mgpu_env.recovery import Recovering, RunDevices, supervise_run
from tests.support import train_process
from tests.support.children import REPO
from tests.support.fake_nvml import FakeGpu, fake_gpus

LOST_GPU = 2


def _weights(folder: Path) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(folder / "model.keras") as saved:
        data = io.BytesIO(saved.read("model.weights.h5"))
    out: dict[str, np.ndarray] = {}
    with h5py.File(data, "r") as weights:
        weights.visititems(lambda name, item: out.__setitem__(name, np.asarray(item))
                           if isinstance(item, h5py.Dataset) else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--fault-step", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    settings = {"PYTHONPATH": f"{REPO / 'tests' / 'fixtures' / 'recover'}:{REPO}",
                "MODEL": "faultmodel:build", "EPOCHS": str(args.epochs), "SEED": str(args.seed),
                "CHECKPOINT_EVERY": "10", "VIRTUAL_DEVICES": "4",
                "BATCH_SIZE": str(args.batch_size)}
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        reference = root / "reference"
        done = train_process.run(reference, **settings)
        if done.returncode:
            sys.exit(f"the reference run failed:\n{done.stderr[-3000:]}")
        # The test's seam below the probe: NVML as pynvml answers with GPU 2 off the bus.
        lost = fake_gpus([FakeGpu() for _ in range(4)], handle_errors={LOST_GPU: 15})
        nvml.load_library = lambda: lost  # type: ignore[assignment]
        folder = root / "run"
        environ = train_process.train_env(folder, **settings, FAULT="crash",
                                          FAULT_AT=str(4 * args.fault_step),
                                          FAULT_ONCE=str(root / "fired"))
        said: list[str] = []
        recovering = Recovering(
            folder, RunDevices((0, 1, 2, 3), 1, 4 * args.batch_size, setting="VIRTUAL_DEVICES"),
            "reduction_to_one", "auto", 1, say=said.append)
        os.chdir(root)
        code = supervise_run([sys.executable, "-m", "entrypoint", "train"], environ,
                             recovering, max_restarts=1, stdout=io.StringIO(),
                             stderr=io.StringIO())
        if code or not (root / "fired").exists():
            sys.exit(f"the recovered run failed ({code}):\n" + "\n".join(said))
        for line in said:
            print(f"log: {line}")
        ours = json.loads((folder / "history.json").read_text())["epochs"]
        theirs = json.loads((reference / "history.json").read_text())["epochs"]
        print(f"{'epoch':>5} {'loss 4 devices':>16} {'loss 4 -> 3':>16} {'|diff|':>10} "
              f"{'acc |diff|':>10}")
        diffs = []
        for a, b in zip(ours, theirs, strict=True):
            diff = abs(a["loss"] - b["loss"])
            diffs.append(diff)
            print(f"{a['epoch']:>5} {b['loss']:>16.9f} {a['loss']:>16.9f} {diff:>10.2e} "
                  f"{abs(a['accuracy'] - b['accuracy']):>10.2e}")
        m_ours = json.loads((folder / "metrics.json").read_text())
        m_ref = json.loads((reference / "metrics.json").read_text())
        w_ours, w_ref = _weights(folder), _weights(reference)
        weights = max(float(np.max(np.abs(w_ours[k] - w_ref[k]))) for k in w_ref)
        print(f"max |loss diff| over {len(diffs)} logged steps: {max(diffs):.3e}")
        print(f"test loss |diff|: {abs(m_ours['test_loss'] - m_ref['test_loss']):.3e}, "
              f"test accuracy |diff|: {abs(m_ours['test_accuracy'] - m_ref['test_accuracy']):.3e}")
        print(f"final weights max |diff|: {weights:.3e}")
        event = m_ours["recovery"][0]
        print(f"recovery: GPU {list(event['dropped'])} dropped, from {event['resumes_from']}, "
              f"{event['replicas_from']} -> {event['replicas_to']} replicas, global batch "
              f"{event['global_batch']}")


if __name__ == "__main__":
    main()
