"""One decision, read by every command: over a grid of machines (fake NVML boards of several
architectures and counts) and settings (a scheduler's assignment, MIXED_PRECISION, KERAS,
GPUS, VIRTUAL_DEVICES), `mgpu doctor --json`, `mgpu train --dry-run --json` and `mgpu bench
--dry-run --json` state the same GPUs, devices, replicas, precision, cluster and Keras, and
where the settings cannot work here, the same part fails in each.

The whole grid goes through the three commands in this process (CliRunner): none imports
TensorFlow for a plan (the pre-flight's TensorFlow answers as TensorFlow would under the
CUDA_VISIBLE_DEVICES the runtime wrote, the memory check's child is the suite's canned one).
Each command builds its own runtime from the machine it probes, so a second decision
anywhere (the doctor's own GPU selection, the bench's own precision) shows as a difference.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from entrypoint.app import app
from mgpu_env.tfprobes import tfprobe
from tests.support.fake_doctor import tf_facts
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus

pytestmark = pytest.mark.usefixtures("canned_host")

Install = Callable[[FakeNvml], FakeNvml]

# Boards by architecture: the compute capability decides the precision (FP16 tensor cores
# from 7.0, bf16 from 8.0).
BOARDS = {
    "pascal": FakeGpu(name="Tesla P100-PCIE-16GB", compute_capability=(6, 0),
                      memory_total=16 << 30, memory_free=15 << 30),
    "volta": FakeGpu(name="Tesla V100-SXM2-32GB", compute_capability=(7, 0),
                     memory_total=32 << 30, memory_free=31 << 30),
    "ampere": FakeGpu(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0)),
    "hopper": FakeGpu(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0)),
}
# Machines: no GPU, one, two, four, and two of different architectures.
MACHINES: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "1xpascal": ("pascal",),
    "2xvolta": ("volta", "volta"),
    "2xampere": ("ampere", "ampere"),
    "4xhopper": ("hopper",) * 4,
    "volta+ampere": ("volta", "ampere"),
}
PORT = "23456"
# What a scheduler or orchestrator gives the process: nothing, a GPU assignment, Slurm's
# second task of two on one node (it gets the second half of the node's GPUs), a
# Kubernetes Indexed Job's second pod of two.
SCHEDULERS: dict[str, dict[str, str]] = {
    "plain": {},
    "assigned": {"CUDA_VISIBLE_DEVICES": "0"},
    "slurm": {
        "SLURM_JOB_ID": "42", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
    },
    "kubernetes": {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": "1",
        "K8S_JOB_NAME": "mgpu-train", "K8S_SERVICE": "mgpu-workers", "K8S_WORKERS": "2",
    },
}
SETTINGS: dict[str, dict[str, str]] = {
    "fp32": {"MIXED_PRECISION": "0"},
    "auto16": {"MIXED_PRECISION": "1"},
    "fp16": {"MIXED_PRECISION": "fp16"},
    "bf16": {"MIXED_PRECISION": "bf16"},
    "bf16-keras3": {"MIXED_PRECISION": "bf16", "KERAS": "3"},
    "keras3-split": {"KERAS": "3", "VIRTUAL_DEVICES": "2"},
    "one-gpu": {"GPUS": "0", "MIXED_PRECISION": "1"},
    "no-gpu": {"GPUS": "none", "MIXED_PRECISION": "1"},
    # The cluster described twice: no cluster can be decided (the rest is, for the doctor).
    "two-clusters": {"WORKER_HOSTS": "localhost:23456,localhost:23457", "WORKER_INDEX": "0",
                     "TF_CONFIG": '{"cluster": {"worker": ["localhost:23456"]}, '
                                  '"task": {"type": "worker", "index": 0}}'},
}
GRID = list(itertools.product(MACHINES, SCHEDULERS, SETTINGS))
# Variables a command writes into the process environment (`Runtime.apply`): each command
# starts from the scenario's own environment.
WRITTEN = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_CONFIG", "TF_USE_LEGACY_KERAS",
           "TF_CPP_MIN_LOG_LEVEL", "TF_DEVICE_TYPES")
# The parts every command states, in `"decisions"`.
PARTS = ("gpus", "device_type", "devices", "replicas", "precision", "cluster", "keras")


def invoke(args: list[str], environ: Mapping[str, str]) -> Result:
    """One command in this process with exactly `environ`'s scheduler variables and
    settings; the process environment as it was afterwards."""
    saved = dict(os.environ)
    env: dict[str, str | None] = {key: None for key in WRITTEN}
    env.update({**environ, "WORKER_PORT": PORT, "BENCH_REPLICAS": "auto"})
    try:
        return CliRunner().invoke(app, args, env=env)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tensorflow_as_cuda_shows_it(fake: FakeNvml) -> Callable[[], Any]:
    """TensorFlow's answer in the pre-flight: the GPUs CUDA_VISIBLE_DEVICES leaves it (the
    runtime wrote it before), all of NVML's when unset."""

    def collect() -> Any:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = len(fake.gpus) if visible is None else len(
            [item for item in visible.split(",") if item.strip()])
        return tf_facts(gpus=count)

    return collect


def disagreements(environ: Mapping[str, str]) -> list[str]:
    """What the three commands state differently for these settings on the machine the
    fake NVML is, each as a line (none: they agree)."""
    doctor = invoke(["doctor", "--json", "--no-tf"], environ)
    judged = json.loads(doctor.stdout)
    stated = judged["decisions"]
    train = invoke(["train", "--dry-run", "--json"], environ)
    bench = invoke(["bench", "--dry-run", "--json"], environ)
    if stated["errors"]:
        # The settings cannot work here: every command refuses them as a bad setting, with
        # the words of the first part the doctor found failing.
        first = next(iter(stated["errors"].values())).splitlines()[0]
        return [f"{name} exits {result.exit_code} / does not say {first!r}: {result.output}"
                for name, result in (("doctor", doctor), ("train", train), ("bench", bench))
                if result.exit_code != 2 or (name != "doctor" and first not in result.stderr)]
    if train.exit_code or bench.exit_code:
        return [f"train exits {train.exit_code}, bench {bench.exit_code}: "
                f"{train.output} {bench.output}"]
    planned, swept = json.loads(train.stdout), json.loads(bench.stdout)
    widest = max(swept["points"], key=lambda point: point["replicas"])
    facts = judged["facts"]
    # Each command's "decisions", then the fields of its own that say the same.
    said = {
        **{f"train {part}": planned["decisions"][part] for part in PARTS},
        **{f"bench {part}": swept["decisions"][part] for part in PARTS},
        "train's devices": planned["devices"], "train's replicas": planned["replicas"],
        "train's precision_policy": planned["precision_policy"],
        "train's cluster": planned["cluster"], "doctor's cluster": judged["cluster"],
        "doctor's selection": [gpu["index"] for gpu in facts["selection"]["gpus"]],
        "doctor's precision": facts["precision"]["policy"],
        "doctor's Keras for training": facts["keras"]["train"]["version"],
        "bench's widest point's precision": widest["precision"],
        "bench's widest point's Keras": widest["keras"],
        "bench's widest point's device type": widest["device_type"],
    }
    expected = {
        "devices": stated["devices"], "replicas": stated["replicas"],
        "precision_policy": stated["precision"], "cluster": stated["cluster"],
        "selection": stated["gpus"], "precision": stated["precision"],
        "training": stated["keras"], "Keras": stated["keras"], "type": stated["device_type"],
    }
    lines = []
    for what, value in said.items():
        part = what.rsplit(" ", 1)[-1]
        want = stated[part] if what.split(" ", 1)[0] in ("train", "bench") \
            and part in PARTS else expected[part]
        if value != want:
            lines.append(f"{what}: {value!r}, the doctor's decisions: {want!r}")
    return lines


@pytest.mark.parametrize("machine", MACHINES)
def test_doctor_train_and_bench_state_the_same_decisions(
    machine: str, use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Every scheduler and settings pair on this machine (`GRID`: all the machines' pairs)."""
    fake = use_fake_nvml(fake_gpus(
        [FakeGpu(**vars(BOARDS[board])) for board in MACHINES[machine]],
        driver_version="555.42.06", cuda_driver_version=12050))
    monkeypatch.setattr(tfprobe, "collect_in_process", tensorflow_as_cuda_shows_it(fake))
    monkeypatch.chdir(tmp_path)
    found = {
        f"{scheduler}, {settings}": lines
        for scheduler, settings in itertools.product(SCHEDULERS, SETTINGS)
        if (lines := disagreements({**SCHEDULERS[scheduler], **SETTINGS[settings]}))
    }
    assert not found, json.dumps(found, indent=1)
