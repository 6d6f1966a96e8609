"""The TensorFlow probe, run in a child: its build and the GPUs it lists.

The TensorFlow probe: its build (CUDA, cuDNN, compute capabilities), the GPUs it lists, and the
cuDNN library the process can load.

Importing TensorFlow takes seconds and can hang or crash on a broken driver, so `mgpu
doctor` runs `collect_in_process` in a child process (`collect`), with the GPU selection
already in the child's environment, and reads one JSON line back. Training, which imports
TensorFlow anyway, calls `collect_in_process` directly. Tests replace `collect`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mgpu_env.hardware import childprobe, cudalibs
from mgpu_env.hardware.cudalibs import (  # cudalibs decodes every library's version
    decode_cudnn_version as decode_cudnn_version,
)
from mgpu_env.hardware.nvml import Probed, probe
from mgpu_env.tfprobes import tflog
from mgpu_env.tfprobes.tfimport import import_tensorflow

JSON_MARKER = "MGPU_TFPROBE_JSON "
DEFAULT_TIMEOUT_S = 300.0
# The environment variables that decide which GPUs TensorFlow sees.
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


@dataclass(frozen=True)
class TfBuildInfo:
    """`tf.sysconfig.get_build_info()`, typed."""

    is_cuda_build: bool
    cuda_version: str | None = None  # "12.5.1"
    cudnn_version: str | None = None  # "9" (the wheel names only the major)
    compute_capabilities: tuple[str, ...] = ()  # ("sm_60", ..., "compute_90")


@dataclass(frozen=True)
class CudnnLibrary:
    """A cuDNN library the process loaded, and its `cudnnGetVersion()`."""

    version: str  # "9.3.0"
    path: str
    mapped_before_probe: bool = False  # already in the process (TensorFlow loaded it)


@dataclass(frozen=True)
class TfFacts:
    """What TensorFlow says about itself and the GPUs it can use."""

    version: Probed[str] = field(default_factory=Probed)
    build: Probed[TfBuildInfo] = field(default_factory=Probed)
    # Physical GPU devices, as in the tutorial's
    # len(tf.config.experimental.list_physical_devices('GPU')).
    gpus: Probed[tuple[str, ...]] = field(default_factory=Probed)
    cudnn: Probed[CudnnLibrary] = field(default_factory=Probed)
    # The visibility variables the probe ran with (absent: not set).
    environment: dict[str, str] = field(default_factory=dict)
    # TensorFlow's own reason, when the probe ran in a child: the relevant lines it wrote on
    # stderr (cuInit, dlopen, "Cannot dlopen" first; `tflog.relevant_lines`).
    log: tuple[str, ...] = ()
    # The CUDA library files mapped into TensorFlow's process after it listed its GPUs
    # (/proc/self/maps): the ones it really loaded, wherever the loader found them.
    loaded: Probed[tuple[str, ...]] = field(default_factory=lambda: Probed(value=()))

    @property
    def num_gpus(self) -> int | None:
        return len(self.gpus.value) if self.gpus.ok and self.gpus.value is not None else None


def failed(
    reason: str, environment: Mapping[str, str] | None = None, log: tuple[str, ...] = ()
) -> TfFacts:
    """Facts that say every TensorFlow probe failed for `reason`."""
    return TfFacts(
        version=Probed(error=reason),
        build=Probed(error=reason),
        gpus=Probed(error=reason),
        cudnn=Probed(error=reason),
        environment=dict(environment or {}),
        log=log,
    )


def build_info_from(raw: Mapping[str, Any]) -> TfBuildInfo:
    """Type the dict `tf.sysconfig.get_build_info()` returns (keys vary across builds)."""
    capabilities = raw.get("cuda_compute_capabilities") or ()
    if isinstance(capabilities, str):
        capabilities = capabilities.replace(",", " ").split()
    return TfBuildInfo(
        is_cuda_build=bool(raw.get("is_cuda_build", False)),
        cuda_version=str(raw["cuda_version"]) if raw.get("cuda_version") else None,
        cudnn_version=str(raw["cudnn_version"]) if raw.get("cudnn_version") else None,
        compute_capabilities=tuple(str(c) for c in capabilities),
    )


def _mapped_libraries(prefix: str) -> list[str]:
    return cudalibs.mapped_libraries(prefix)


def _pip_cudnn_candidates() -> list[str]:
    # tensorflow[and-cuda] installs cuDNN as the nvidia-cudnn-cu12 wheel, outside ld's path,
    # where TensorFlow's RUNPATH finds it (see cudalibs).
    folder = cudalibs.wheel_root() / cudalibs.spec("cudnn").package / "lib"
    return sorted(str(p) for p in folder.glob("libcudnn.so*"))


def loaded_cudnn() -> CudnnLibrary:
    """The cuDNN this process uses: the one already mapped, else the one the loader finds.

    Raises RuntimeError naming where it looked when there is none (a CPU machine).
    """
    mapped = _mapped_libraries("libcudnn.so")
    candidates = [*mapped, *_pip_cudnn_candidates(), "libcudnn.so.9", "libcudnn.so.8"]
    reasons = []
    for candidate in candidates:
        try:
            library = ctypes.CDLL(candidate)
        except OSError as err:
            reasons.append(str(err).split(":")[-1].strip() or candidate)
            continue
        get_version = library.cudnnGetVersion
        get_version.restype = ctypes.c_size_t
        return CudnnLibrary(
            version=decode_cudnn_version(int(get_version())),
            path=candidate,
            mapped_before_probe=candidate in mapped,
        )
    raise RuntimeError(
        "no cuDNN library found (tried " + ", ".join(candidates) + ")"
    )


# What a CUDA library's file name starts with: libcudnn.so, libcublas.so, ..., libcuda.so.
CUDA_PREFIXES = (*(cudalibs.soname_prefix(spec.soname) for spec in cudalibs.LIBRARIES),
                 "libcuda.so")


def mapped_cuda_libraries() -> tuple[str, ...]:
    """Every CUDA library file this process has mapped, in LIBRARIES order."""
    paths: list[str] = []
    for prefix in CUDA_PREFIXES:
        paths += [p for p in _mapped_libraries(prefix) if p not in paths]
    return tuple(paths)


def collect_in_process() -> TfFacts:
    """Import TensorFlow here and ask it. Never raises. The GPU selection must be applied."""
    environment = {k: os.environ[k] for k in VISIBILITY_VARIABLES if k in os.environ}
    try:
        tf = import_tensorflow()
    except Exception as err:
        return failed(f"TensorFlow does not import: {type(err).__name__}: {err}", environment)
    return TfFacts(
        version=probe(lambda: str(tf.__version__)),
        build=probe(lambda: build_info_from(dict(tf.sysconfig.get_build_info()))),
        gpus=probe(
            lambda: tuple(d.name for d in tf.config.experimental.list_physical_devices("GPU"))
        ),
        cudnn=probe(loaded_cudnn),
        environment=environment,
        loaded=probe(mapped_cuda_libraries),
    )


def to_json(facts: TfFacts) -> str:
    def probed(p: Probed[Any]) -> dict[str, Any]:
        value = p.value
        if isinstance(value, TfBuildInfo | CudnnLibrary):
            value = value.__dict__
        return {"value": value, "error": p.error}

    return json.dumps(
        {
            "version": probed(facts.version),
            "build": probed(facts.build),
            "gpus": probed(facts.gpus),
            "cudnn": probed(facts.cudnn),
            "loaded": probed(facts.loaded),
            "environment": facts.environment,
        }
    )


def from_json(text: str) -> TfFacts:
    data = json.loads(text)

    def probed(key: str, make: Callable[[Any], Any]) -> Probed[Any]:
        item = data[key]
        if item["error"] is not None:
            return Probed(error=item["error"])
        return Probed(value=make(item["value"]))

    return TfFacts(
        version=probed("version", str),
        build=probed(
            "build",
            lambda v: TfBuildInfo(
                is_cuda_build=v["is_cuda_build"],
                cuda_version=v["cuda_version"],
                cudnn_version=v["cudnn_version"],
                compute_capabilities=tuple(v["compute_capabilities"]),
            ),
        ),
        gpus=probed("gpus", tuple),
        cudnn=probed("cudnn", lambda v: CudnnLibrary(**v)),
        loaded=probed("loaded", tuple) if "loaded" in data else Probed(value=()),
        environment=dict(data.get("environment", {})),
    )


def collect(environ: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> TfFacts:
    """Run `collect_in_process` in a child Python with `environ`. Never raises."""
    env = dict(environ)
    # Every line TensorFlow logs comes back on the child's stderr (its import log too:
    # MGPU_DEBUG=1), and `tflog` keeps the few that say why a GPU is missing.
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    env["MGPU_DEBUG"] = "1"
    visibility = {k: env[k] for k in VISIBILITY_VARIABLES if k in env}
    done = childprobe.ask([sys.executable, "-m", "mgpu_env.tfprobes.tfprobe"], env,
                          marker=JSON_MARKER, timeout_s=timeout_s)
    if done.start_error is not None:
        return failed(done.start_error, visibility)
    if done.timed_out:
        return failed(f"TensorFlow did not answer within {timeout_s:g} s", visibility)
    log = tflog.relevant_lines(done.stderr or "")
    if done.answer is None:
        return failed(done.exited("the TensorFlow probe"), visibility, log)
    try:
        return dataclasses.replace(from_json(done.answer), log=log)
    except (ValueError, KeyError, TypeError) as err:
        return failed(f"unreadable answer from the TensorFlow probe: {err}", visibility, log)


def main() -> None:
    print(JSON_MARKER + to_json(collect_in_process()), flush=True)


if __name__ == "__main__":
    main()
