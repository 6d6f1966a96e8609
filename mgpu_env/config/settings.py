"""Every setting of mgpu-env, declared once: env var, default, help, validation.

A setting's value comes from, in order of precedence: its command-line flag, the process
environment, the `.env` file (or the file `ENV_FILE` names), and finally its default.
Each field of `Settings` below is the single declaration of one setting; the CLI builds
its flags from these declarations and `resolve_settings` applies the precedence and the
validation. Nothing here imports TensorFlow, so bad values are refused in milliseconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from mgpu_env.config.declaration import (  # re-exported: what a declaration is
    ROLES,
    Declaration,
    Role,
    setting,
)
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.parsers import (  # re-exported: the settings' vocabulary
    CheckpointInterval,
    GpuRequest,
    SettingError,
    parse_bool,
    parse_checkpoint_every,
    parse_choice,
    parse_choice_list,
    parse_dataset,
    parse_gpus,
    parse_int,
    parse_name_or_hook,
    parse_optional_dir_must_exist,
    parse_optional_env_file,
    parse_optional_index,
    parse_optional_output_dir,
    parse_positive_float,
    parse_replica_counts,
    parse_run_name,
    parse_tf_config,
    parse_worker_hosts,
)
from mgpu_env.config.stalltime import StallTimeout, parse_stall_timeout

__all__ = ["BY_ENV", "DECLARATIONS", "ROLES", "Declaration", "GpuRequest", "Role", "SettingError",
           "Settings", "SettingsErrors", "setting", "with_role"]

T = TypeVar("T")

DEFAULT_ENV_FILE = ".env"


class SettingsErrors(ConfigError):
    """One or more settings are bad; `errors` holds one user-facing message each (exit 2)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors

    def user_message(self) -> str:
        return "\n".join(f"error: {e}" for e in self.errors)


# How a run trains: shown, recorded and resumed, so `OUTPUT_DIR=<folder> mgpu train` trains
# the same run; a script under mgpu run decides the loop's own (`LOOP_SETTING`).
RUN_SETTING: tuple[Role, ...] = ("shown", "recorded", "resumed")
LOOP_SETTING: tuple[Role, ...] = (*RUN_SETTING, "script")
MixedPrecision = Literal["0", "1", "fp16", "bf16"]
CrossDeviceOps = Literal["auto", "nccl", "hierarchical_copy", "reduction_to_one"]
# Scopes: settings of mgpu train's own loop (a script under `mgpu run` decides these
# itself), and of that loop and mgpu bench, which trains the same model on the same data.
TRAIN = ("train",)
LOOP = ("train", "bench")
KerasRequest = Literal["auto", "3", "2"]
DATASETS: tuple[str, ...] = ("auto", "mnist", "digits", "synthetic", "fashion_mnist")


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one run. Each field is the one declaration of a setting."""

    gpus: GpuRequest = setting(
        "GPUS", "all",
        "GPUs to use: all, none (CPU only), indices in nvidia-smi order (0,1) or GPU UUIDs.",
        parse_gpus, "all, none, a comma list of GPU indices like 0,1, or GPU UUIDs",
        metavar="LIST", roles=RUN_SETTING,
    )
    mixed_precision: MixedPrecision = setting(
        "MIXED_PRECISION", "0",
        "Mixed precision: 0 off, 1 the best for the device (fp16 on GPUs with tensor cores, "
        "bf16 on CPUs with bf16 instructions, else float32), fp16, bf16.",
        parse_choice("0", "1", "fp16", "bf16"), "0, 1, fp16, bf16", metavar="MODE",
        roles=(*RUN_SETTING, "identity", "agreed"), identity="precision_policy",  # the policy
    )
    keras: KerasRequest = setting(
        "KERAS", "auto",
        "Which Keras tf.keras is: auto (Keras 2, tf_keras, for an mgpu run script that uses "
        "Keras 2 APIs or runs between workers; else Keras 3), 3, or 2 (needs tf-keras).",
        parse_choice("auto", "3", "2"), "auto, 3, 2", metavar="VERSION",
        roles=(*RUN_SETTING, "agreed"),  # agreed: the Keras it chose (2 or 3)
    )
    epochs: int = setting(
        "EPOCHS", "5", "Epochs to train (the tutorial trains 5).",
        parse_int(1, 100_000), "a whole number from 1 to 100000", metavar="N", scope=TRAIN,
        roles=(*LOOP_SETTING, "agreed"),
    )
    profile: int = setting(
        "PROFILE", "0", "Steps mgpu train profiles with TensorFlow's profiler before its first "
        "epoch, into the run's logs/ (TensorBoard's Profile tab); 0: none, nothing imported.",
        parse_int(0, 1000), "a whole number from 0 to 1000", metavar="STEPS", scope=TRAIN,
        roles=("shown", "recorded"),
    )
    batch_size: int = setting(
        "BATCH_SIZE", "64",
        "Batch size per replica; the global batch is BATCH_SIZE x replicas.",
        parse_int(1, 1_048_576), "a whole number from 1 to 1048576", metavar="N", scope=LOOP,
        roles=(*LOOP_SETTING, "identity", "agreed"), identity="per_replica_batch_size",
    )
    learning_rate: float = setting(
        "LEARNING_RATE", "0.001", "Adam's learning rate.",
        parse_positive_float(10.0), "a number above 0 and at most 10, e.g. 0.001",
        metavar="RATE", scope=TRAIN,
        roles=(*LOOP_SETTING, "identity", "agreed"), identity="learning_rate",
    )
    dataset: str = setting(
        "DATASET", "auto",
        "Data set: mnist, digits (offline, built in), fashion_mnist, synthetic; auto takes "
        "mnist when it can be had, else digits; files: tfrecord:DIR, images:DIR, npy:DIR; "
        "or your loader, package.module:function.",
        parse_dataset(*DATASETS),
        ", ".join(DATASETS) + ", tfrecord:DIR, images:DIR, npy:DIR (an existing folder), "
        "or package.module:function (your loader)", metavar="NAME",
        scope=LOOP,
        # The identity and the agreement hold the data set `auto` chose.
        roles=(*LOOP_SETTING, "identity", "agreed"), identity="dataset",
    )
    model: str = setting(
        "MODEL", "mlp",
        "Model mgpu train (and mgpu bench) trains: mlp (the tutorial's 784-64-64-10), or your "
        "builder, package.module:function, called as build(input_shape, num_classes).",
        parse_name_or_hook("mlp"), "mlp, or package.module:function (your builder)",
        metavar="NAME", scope=LOOP,
        # In the identity only when set, so folders of runs from before MODEL still resume.
        roles=(*LOOP_SETTING, "identity", "agreed"), identity="model", identity_if_set=True,
    )
    data_dir: Path | None = setting(
        "DATA_DIR", "",
        "Folder with data files (mnist.npz, Fashion-MNIST IDX files); empty: Keras' cache.",
        parse_optional_dir_must_exist, "an existing folder, or empty", metavar="DIR", scope=LOOP,
        roles=LOOP_SETTING,
    )
    output_dir: Path | None = setting(
        "OUTPUT_DIR", "",
        "Where checkpoints, logs, the model and metrics.json go; the same folder again "
        "resumes. Empty: runs/<RUN_NAME or timestamp>.",
        parse_optional_output_dir, "a folder (created if missing), or empty", metavar="DIR",
        help_for={"bench": "Where bench.json and bench.png go. Empty: "
                           "runs/bench-<RUN_NAME or timestamp>."},
        # Where this start writes, not how the run trains: never taken from a folder.
        roles=("shown", "recorded"),
    )
    run_name: str = setting(
        "RUN_NAME", "", "Name of the run folder under runs/ when OUTPUT_DIR is empty.",
        parse_run_name, "a folder name: letters, digits, '.', '_', '-' (no '/')",
        metavar="NAME",
        help_for={"bench": "Names the results folder runs/bench-<RUN_NAME> when OUTPUT_DIR "
                           "is empty."},
        roles=("shown", "recorded"),
    )
    virtual_devices: int = setting(
        "VIRTUAL_DEVICES", "0",
        "Split each visible device (the CPU when no GPU) into N logical devices, so "
        "MirroredStrategy runs N replicas on one device; 0 is off.",
        parse_int(0, 64), "a whole number from 0 to 64", metavar="N", roles=RUN_SETTING,
    )
    xla: bool = setting(
        "XLA", "0", "Compile the training step with XLA (jit_compile).",
        parse_bool, "0 or 1 (also true/false, yes/no, on/off)", kind="switch", scope=LOOP,
        roles=(*LOOP_SETTING, "agreed"),
    )
    cross_device_ops: CrossDeviceOps = setting(
        "CROSS_DEVICE_OPS", "auto",
        "All-reduce: auto (NCCL where it works), nccl, hierarchical_copy, reduction_to_one.",
        parse_choice("auto", "nccl", "hierarchical_copy", "reduction_to_one"),
        "auto, nccl, hierarchical_copy, reduction_to_one", metavar="NAME", roles=RUN_SETTING,
    )
    seed: int = setting(
        "SEED", "42", "Random seed for weights and shuffling.",
        parse_int(0, 2**31 - 1), "a whole number from 0 to 2147483647", metavar="N", scope=LOOP,
        roles=(*LOOP_SETTING, "identity", "agreed"), identity="seed",
    )
    data_deterministic: bool = setting(
        "DATA_DETERMINISTIC", "1",
        "Data streamed through tf.data (data too big to keep on each device) keeps its order, "
        "so runs repeat; 0 lets parallel stages hand out batches as they finish (faster when "
        "batches take uneven time to read, but the order and the losses vary).",
        parse_bool, "0 or 1 (also true/false, yes/no, on/off)", kind="switch", scope=LOOP,
        roles=LOOP_SETTING,
    )
    bench_model: str = setting(
        "BENCH_MODEL", "mlp", "Model mgpu bench measures: mlp (the tutorial's), resnet (a small "
        "ResNet on 32x32x3 images, 0.7M parameters) or resnet50 (Keras' ResNet-50, untrained, "
        "on synthetic 224x224x3 images: the model of NVIDIA's published scaling tables).",
        parse_choice("mlp", "resnet", "resnet50"), "mlp, resnet, resnet50", metavar="NAME",
        scope="bench",
    )
    bench_explain: bool = setting(
        "BENCH_EXPLAIN", "0", "mgpu bench also profiles a few steps of each point: where the "
        "step's time goes (TensorFlow's profiler), the all-reduce predicted, the bottleneck.",
        parse_bool, "0 or 1 (also true/false, yes/no, on/off)", kind="switch", scope="bench",
    )
    bench_replicas: tuple[int, ...] = setting(
        "BENCH_REPLICAS", "auto",
        "Replica counts mgpu bench sweeps: auto (1, 2, 4, ... up to the selected GPUs, or "
        "to VIRTUAL_DEVICES when it is 2 or more) or a comma list like 1,2,4.",
        parse_replica_counts, "auto, or a comma list of whole numbers from 1 to 64 like 1,2,4",
        metavar="LIST", scope="bench",
    )
    bench_sweep: tuple[str, ...] = setting(
        "BENCH_SWEEP", "",
        "Axes mgpu bench sweeps besides replicas: precision (fp32 and mixed), xla (off and "
        "on); a comma list, empty for neither (MIXED_PRECISION and XLA then apply).",
        parse_choice_list("precision", "xla"), "empty, or a comma list of precision, xla",
        metavar="LIST", scope="bench",
    )
    bench_data: str = setting(
        "BENCH_DATA", "synthetic",
        "Input mgpu bench feeds: synthetic (tensors already on the device), real (DATASET "
        "as mgpu train feeds it: kept on each device), stream (DATASET through the tf.data "
        "stream, the path for data that does not fit), both (synthetic and real: reports the "
        "input's cost), all (synthetic, real and stream).",
        parse_choice("synthetic", "real", "stream", "both", "all"),
        "synthetic, real, stream, both, all", metavar="MODE",
        scope="bench",
    )
    bench_warmup: int = setting(
        "BENCH_WARMUP", "10", "Warm-up steps mgpu bench runs and does not time (tracing too).",
        parse_int(1, 100_000), "a whole number from 1 to 100000", metavar="N", scope="bench",
    )
    bench_steps: int = setting(
        "BENCH_STEPS", "100", "Training steps in each interval mgpu bench times.",
        parse_int(1, 100_000), "a whole number from 1 to 100000", metavar="N", scope="bench",
    )
    bench_intervals: int = setting(
        "BENCH_INTERVALS", "20",
        "Timed intervals per point, in rounds that alternate the data variants; mgpu bench "
        "reports their median and spread.",
        parse_int(2, 1000), "a whole number from 2 to 1000", metavar="N", scope="bench",
    )
    bench_compare: bool = setting(
        "BENCH_COMPARE", "0",
        "mgpu bench also runs the tutorial's plain model.fit on the same data and device and "
        "prints mgpu's throughput as a multiple of it.",
        parse_bool, "0 or 1 (also true/false, yes/no, on/off)", kind="switch", scope="bench",
    )
    bench_timeout: int = setting(
        "BENCH_TIMEOUT", "900",
        "Seconds one mgpu bench point may take before it is stopped and recorded as failed "
        "(a hung all-reduce never hangs the whole sweep); a process measuring several data "
        "variants together gets that for each.",
        parse_int(10, 86_400), "a whole number of seconds from 10 to 86400", metavar="S",
        scope="bench",
    )
    tf_config: str = setting(
        "TF_CONFIG", "",
        "Multi-worker cluster as TensorFlow reads it (JSON), set by Kubernetes' TFJob and "
        "other launchers; switches to MultiWorkerMirroredStrategy. Empty: one process.",
        parse_tf_config,
        'empty, or JSON like {"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
        '"task": {"type": "worker", "index": 0}}',
        metavar="JSON",
        roles=("recorded",),
    )
    worker_hosts: tuple[str, ...] = setting(
        "WORKER_HOSTS", "",
        "Multi-worker without writing TF_CONFIG: every worker's host:port, the same list on "
        "each, the chief (index 0) first; builds TF_CONFIG with WORKER_INDEX.",
        parse_worker_hosts, "empty, or a comma list of host:port like w0:2222,w1:2222",
        metavar="LIST",
        roles=("recorded",),
    )
    worker_index: int | None = setting(
        "WORKER_INDEX", "",
        "This worker's position in WORKER_HOSTS (0 is the chief, which writes the outputs).",
        parse_optional_index, "empty, or a whole number from 0 to the number of hosts - 1",
        metavar="N",
        roles=("recorded",),
    )
    worker_port: int = setting(
        "WORKER_PORT", "2222",
        "Multi-worker under Slurm or a Kubernetes Indexed Job: the port each worker listens "
        "on (Slurm: plus the task's local id, so tasks on one node never collide).",
        parse_int(1024, 65535), "a whole number from 1024 to 65535", metavar="PORT",
        roles=("recorded",),
    )
    worker_timeout: float = setting(
        "WORKER_TIMEOUT", "300",
        "Multi-worker: seconds a worker waits for the others (to join, or to finish a "
        "step) before it stops; a dead worker is noticed in about 10 s anyway.",
        parse_positive_float(86_400.0), "a number of seconds above 0, at most 86400",
        metavar="SECONDS", scope=TRAIN,
        roles=("recorded", "script"),
    )
    stall_timeout: StallTimeout = setting(
        "STALL_TIMEOUT", "auto",
        "A run (mgpu train, or mgpu run's script) that makes no progress in a phase for this "
        "long stops as stalled (exit 3), saying where it hung and what to try: auto bounds "
        "each phase from this machine (start-up, compile, the measured step time); a time "
        "bounds every phase; 0 turns the watchdog off.",
        parse_stall_timeout, "auto, 0 (off), or a time from 1s to 168h: seconds (600) or "
        "ending in s, m or h (90s, 10m, 1h)",
        metavar="TIME", scope=("train", "run"), roles=("recorded",),
    )
    checkpoint_every: CheckpointInterval = setting(
        "CHECKPOINT_EVERY", "10m",
        "Checkpoints inside an epoch, with the data's position: every N steps, or a time "
        "(90s, 10m, 1h) checked after each call of steps; 0 or epoch: at epoch ends only.",
        parse_checkpoint_every, "0 or epoch, a whole number of steps (e.g. 500), or a time "
        "from 1s to 168h ending in s, m or h (e.g. 90s, 10m, 1h)",
        metavar="EVERY", scope=TRAIN, roles=(*RUN_SETTING, "agreed"),
    )
    max_restarts: int = setting(
        "MAX_RESTARTS", "0",
        "When the run (mgpu train, one process or --workers) or a worker dies or stalls, "
        "start it again from the last checkpoint, at most N times (as torchrun "
        "--max-restarts), leaving out a GPU that failed; 0 stops at the first.",
        parse_int(0, 1000), "a whole number from 0 to 1000", metavar="N", scope=("train", "run"),
    )
    min_gpus: int = setting(
        "MIN_GPUS", "1",
        "With --max-restarts: the fewest GPUs a restarted run goes on with after leaving out "
        "those that failed the health check; below it, the run stops.",
        parse_int(1, 1024), "a whole number from 1 to 1024", metavar="N", scope=TRAIN,
        roles=("shown", "recorded"),
    )
    quiet: bool = setting(
        "QUIET", "0", "Print no per-epoch progress, only the start and end summaries.",
        parse_bool, "0 or 1 (also true/false, yes/no, on/off)", kind="switch", short="-q",
        roles=("shown", "recorded"),
    )
    env_file: Path | None = setting(
        "ENV_FILE", "",
        f"Settings file read after the environment (default: {DEFAULT_ENV_FILE} if present).",
        parse_optional_env_file, "an existing file, or empty", metavar="FILE",
        roles=("recorded",),
    )

    def describe(self) -> dict[str, str]:
        """The settings as text, keyed by env var, for summaries and metrics."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            if "env" not in f.metadata:
                continue
            value = getattr(self, f.name)
            out[f.metadata["env"]] = "" if value is None else str(value)
        return out

    def as_text(self) -> dict[str, str]:
        """The settings as a user would write them (lists comma-separated, switches 0/1),
        keyed by env var."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                text = ""
            elif isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, tuple):
                text = ",".join(str(v) for v in value)
            else:
                text = str(value)
            out[f.metadata["env"]] = text
        return out


# A field's metadata holds exactly the declaration's other fields (see `setting`).
DECLARATIONS: tuple[Declaration, ...] = tuple(
    Declaration(field_name=f.name, **f.metadata) for f in dataclasses.fields(Settings)
)
BY_ENV: dict[str, Declaration] = {d.env: d for d in DECLARATIONS}


def with_role(role: Role) -> tuple[str, ...]:
    """The env names of the settings with `role`, in declaration order."""
    return tuple(d.env for d in DECLARATIONS if role in d.roles)
