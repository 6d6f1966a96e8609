"""What a stall most likely means and what to try: the words of the stall watch's report.

The meaning depends on each phase of a run and on the devices it runs on; the report is
`stall.StallWatch`'s. Pure.

The public threads these answer: training that stops after NCCL's "Init COMPLETE" with no
error (tensorflow#60363, 4 V100), that sits in "Epoch 1" after `batch_all_reduce ...
algorithm = nccl` (tensorflow#44976), that stalls after some steps (tensorflow#22889); the
fixes users converged on there: another all-reduce (hierarchical copy), NCCL_P2P_DISABLE=1,
and IOMMU or PCIe ACS off (NCCL's troubleshooting guide).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mgpu_env.config.text import shown

# The phases of a run, in order, as the watch names them.
STARTING = "starting (TensorFlow's import, the data's load)"
STRATEGY = "building the strategy (the devices' set-up)"
MODEL = "building the model and restoring the checkpoint"
FIRST_STEP = "the first step (tracing, compiling, the collectives' set-up)"
STEPS = "training steps"
SAVING = "saving the checkpoint"
EVALUATING = "evaluating"
# `mgpu run`: a script's own code between what the watch sees of TensorFlow (its data's
# load, its model's build, its work after training) has no bound: nothing there is known
# to be TensorFlow's, and a script may take hours over it.
SCRIPT_CODE = "the script's own code"
# A worker that failed (its error said): its shutdown may wait on a worker that is gone.
STOPPING = "stopping after the error above"
# The bounded ones.
PHASES = (STARTING, STRATEGY, MODEL, FIRST_STEP, STEPS, SAVING, EVALUATING, STOPPING)


@dataclass(frozen=True)
class Devices:
    """What the hints need to know of the run: its replicas (every worker's), their device
    type and the all-reduce, the NCCL variables set (name -> value) and its workers."""

    replicas: int
    device_type: str  # "GPU" or "CPU"
    cross_device_ops: str  # nccl, hierarchical_copy, reduction_to_one, ring, auto, none
    nccl: Mapping[str, str]
    workers: int = 1

    @property
    def collectives(self) -> bool:
        return self.replicas > 1

    @property
    def nccl_all_reduce(self) -> bool:
        return self.collectives and self.device_type == "GPU" and self.cross_device_ops == "nccl"


NCCL_THREADS = "tensorflow#60363, #44976, #22889"


def _collective_hint(devices: Devices) -> tuple[str, str]:
    if devices.workers > 1:
        return (f"the all-reduce between the {devices.workers} workers ({devices.replicas} "
                f"replicas) never completed: another worker is stuck, stopped or cannot be "
                "reached (its own report names its phase), or NCCL between the machines "
                "hangs (tensorflow#60363)",
                "read every worker's report: the one stuck elsewhere is the cause; check the "
                "workers reach each other (WORKER_HOSTS); NCCL_DEBUG=INFO shows where NCCL "
                "stops; NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1 to rule out a transport")
    if devices.nccl_all_reduce:
        p2p = devices.nccl.get("NCCL_P2P_DISABLE")
        meaning = (
            f"NCCL's all-reduce across {devices.replicas} GPUs never completed: most often "
            "peer-to-peer copies between the GPUs that the machine blocks (an IOMMU, or PCIe "
            f"ACS on the bridges between them; {NCCL_THREADS})"
            + (f"; NCCL_P2P_DISABLE={shown(p2p)} was already set" if p2p else "")
        )
        fix = ("CROSS_DEVICE_OPS=hierarchical_copy (no NCCL), or NCCL_P2P_DISABLE=1; run "
               "`mgpu doctor` for the links and IOMMU, and NCCL_DEBUG=INFO to see where NCCL "
               "stops; disabling ACS or the IOMMU (iommu=pt) is the lasting fix")
        return meaning, fix
    if devices.collectives:
        other = "" if devices.cross_device_ops == "reduction_to_one" else (
            "CROSS_DEVICE_OPS=reduction_to_one, or ")
        return (f"the all-reduce ({devices.cross_device_ops}) across {devices.replicas} "
                f"{devices.device_type} replicas, or a replica's input, never completed",
                f"{other}fewer replicas, to find which part hangs")
    return ("one replica: no collective is involved, so the step itself (the model's code, "
            "a py_function, the input pipeline) is blocked", "see the main thread's stack")


def hint(phase: str, devices: Devices) -> tuple[str, str]:
    """(what the stall most likely means, what to try) for `phase` on `devices`."""
    if phase == STARTING:
        return ("TensorFlow's start or the data's load is blocked: a data folder on a slow "
                "or hung network file system, a DATASET loader that waits, or a driver "
                "that does not answer (`nvidia-smi` hangs too)",
                "run `mgpu doctor`; check the data's folder can be read (`ls` it)")
    if phase == STRATEGY and devices.workers > 1:
        return (f"the {devices.workers} workers did not all join: MultiWorkerMirroredStrategy "
                "waits for every worker in WORKER_HOSTS before it is built, so one is not "
                "started, cannot be reached, or is stuck before its strategy",
                "start every worker with the same WORKER_HOSTS; check each one's address can "
                "be reached from here")
    if phase == STRATEGY:
        return ("the strategy's devices did not come up: a GPU or its driver that does not "
                "answer, or one held by another process",
                "run `mgpu doctor` (each GPU's health and compute mode); GPUS= a subset")
    if phase == MODEL:
        return ("the model's variables were not created or the checkpoint not read: each "
                "variable is mirrored to every replica here, and the checkpoint read from "
                "the run folder's disk",
                "check the run folder's file system; with several GPUs, as for the first step")
    if phase in (FIRST_STEP, STEPS):
        meaning, fix = _collective_hint(devices)
        if phase == FIRST_STEP:
            meaning = f"the first step did not end: {meaning}"
        else:
            meaning = f"steps ran, then one did not end: {meaning}"
        return meaning, fix
    if phase == SAVING:
        return ("the checkpoint's write did not end: the run folder's disk or network file "
                "system does not answer (the previous checkpoint stays the one referenced)",
                "check the run folder's file system (`df`, `touch` a file there)")
    if phase == EVALUATING:
        meaning, fix = _collective_hint(devices)
        return f"the evaluation did not end: {meaning}", fix
    if phase == STOPPING:
        return ("the process's shutdown waits on a worker that is gone (TensorFlow's "
                "collectives end with the cluster); the error above is the cause",
                "act on that error; nothing more is wrong here")
    return ("no progress", "see the stacks")
