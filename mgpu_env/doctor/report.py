"""`mgpu doctor --report`: everything a bug report needs, as data (the CLI renders Markdown).

Like `accelerate env` and `python -m torch.utils.collect_env`: versions, the TensorFlow
build, the driver, each GPU, NCCL, CPU and RAM, the packages that differ from
requirements.lock, and the settings with where each came from. Built from a doctor
`Diagnosis` (nothing is probed twice) plus a few probes of its own, each of which answers
"could not collect (why)" rather than fail. Values of variables whose names say token, key,
secret or password are masked, and so are passwords inside URLs.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from mgpu_env.about import About, about
from mgpu_env.config.resolve import ResolvedSettings
from mgpu_env.config.settings import BY_ENV
from mgpu_env.doctor.facts import Facts
from mgpu_env.doctor.verdict import Diagnosis
from mgpu_env.hardware import limits as machine_limits
from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import Probed, probe

MASK = "****"
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
_URL_PASSWORD = re.compile(r"(//[^/:@\s]+):[^/@\s]+@")
# Variables, besides the settings, that change how TensorFlow, CUDA or NCCL behave.
REPORTED_PREFIXES = ("NCCL_", "TF_", "CUDA_", "NVIDIA_", "XLA_", "MGPU_", "KERAS_", "CUDNN_")
# Where the lock is: MGPU_LOCK_FILE (the image sets it), else beside the source tree.
LOCK_FILE_VARIABLE = "MGPU_LOCK_FILE"
SOURCE_LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def masked(name: str, value: str) -> str:
    """`value`, unless `name` says it is a secret; a password inside a URL is hidden too."""
    if any(word in name.upper() for word in SECRET_WORDS):
        return MASK
    return _URL_PASSWORD.sub(rf"\1:{MASK}@", value)


@dataclass(frozen=True)
class GpuLine:
    index: int
    name: str
    memory: str
    compute_capability: str
    mig: str
    used: bool


@dataclass(frozen=True)
class PackageDrift:
    """A locked package whose installed version differs (None: not installed)."""

    name: str
    locked: str
    installed: str | None


@dataclass(frozen=True)
class BugReport:
    """What `mgpu doctor --report` shows, as data; every value is display text."""

    about: About
    verdict: str
    system: dict[str, str]
    tensorflow: dict[str, str]
    driver: dict[str, str]
    gpus: tuple[GpuLine, ...]
    nccl: str
    packages: Probed[tuple[PackageDrift, ...]]
    settings: dict[str, dict[str, str]]
    environment: dict[str, str]
    problems: tuple[tuple[str, str, str], ...] = field(default=())  # status, check, found

    def to_dict(self) -> dict[str, Any]:
        import dataclasses

        data = dataclasses.asdict(self)
        data["packages"] = {"value": data["packages"]["value"],
                            "error": data["packages"]["error"]}
        return data


# ------------------------------------------------------------------------------ probes


def probe_cpu(cpuinfo: Path | None = None) -> str:
    def describe() -> str:
        model = ""
        for line in (cpuinfo or host_path("/proc/cpuinfo")).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                model = value.strip()
                break
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        cores = f"{os.cpu_count()} logical CPUs"
        if usable is not None and usable != os.cpu_count():
            cores += f" ({usable} usable by this process)"
        return f"{model or platform.processor() or platform.machine()}, {cores}"

    return probe(describe).text()


def probe_memory(meminfo: Path | None = None) -> str:
    def describe() -> str:
        values = {}
        for line in (meminfo or host_path("/proc/meminfo")).read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                values[key] = int(value.split()[0]) * 1024
        total, available = values["MemTotal"], values.get("MemAvailable")
        text = f"{total / 1024**3:.1f} GiB"
        return text + (f" ({available / 1024**3:.1f} GiB available)" if available else "")

    return probe(describe).text()


def probe_nccl() -> str:
    """NCCL's version: the pip wheel TensorFlow's CUDA build uses, else the loadable
    library's ncclGetVersion()."""

    def from_library() -> str:
        library = ctypes.CDLL("libnccl.so.2")
        code = ctypes.c_int()
        library.ncclGetVersion(ctypes.byref(code))
        value = code.value  # 2.9 and later: major * 10000 + minor * 100 + patch
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100} (libnccl.so.2)"

    for distribution in ("nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return f"{metadata.version(distribution)} ({distribution})"
        except metadata.PackageNotFoundError:
            continue
    found = probe(from_library)
    return found.value if found.ok and found.value else (
        "not found (no nvidia-nccl wheel, no libnccl.so.2: "
        "fine on the CPU; NCCL all-reduce needs it)"
    )


def read_lock(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements lock that apply to this platform (the locks
    are universal: `colorama==0.4.6 ; sys_platform == 'win32'` is not for Linux), by
    normalised name."""
    from packaging.markers import Marker

    pins = {}
    for line in path.read_text().splitlines():
        requirement, _, marker = line.split("#", 1)[0].partition(";")
        requirement = requirement.strip()
        marker = marker.strip().rstrip("\\").strip()
        if marker and not Marker(marker).evaluate():
            continue
        name, sep, version = requirement.partition("==")
        if sep and name and not requirement.startswith("-"):
            pins[_normalise(name)] = version.strip().split()[0]
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_file(environ: Mapping[str, str]) -> Path:
    named = environ.get(LOCK_FILE_VARIABLE, "").strip()
    path = Path(named) if named else SOURCE_LOCK
    if not path.is_file():
        raise FileNotFoundError(
            f"no requirements.lock at {path} (set {LOCK_FILE_VARIABLE} to its path)"
        )
    return path


def probe_package_drift(environ: Mapping[str, str]) -> Probed[tuple[PackageDrift, ...]]:
    """Every locked package whose installed version differs from the lock."""

    def drift() -> tuple[PackageDrift, ...]:
        installed = {
            _normalise(d.metadata["Name"]): d.version for d in metadata.distributions()
            if d.metadata["Name"]
        }
        return tuple(
            PackageDrift(name, locked, installed.get(name))
            for name, locked in sorted(read_lock(lock_file(environ)).items())
            if installed.get(name) != locked
        )

    return probe(drift)


# ----------------------------------------------------------------------------- report


def _gpu_lines(diagnosis: Diagnosis) -> tuple[GpuLine, ...]:
    used = {gpu.index for gpu in diagnosis.facts.selected}
    lines = []
    for gpu in diagnosis.facts.gpus:
        total = gpu.memory_total_mib
        cc = gpu.compute_capability
        mig = gpu.mig_enabled
        lines.append(GpuLine(
            index=gpu.index,
            name=gpu.name,
            memory=f"{(total.value or 0) / 1024:.1f} GiB" if total.ok else total.text(),
            compute_capability=f"{cc.value[0]}.{cc.value[1]}" if cc.ok and cc.value
            else cc.text(),
            mig=("on" if mig.value else "off") if mig.ok else mig.text(),
            used=gpu.index in used,
        ))
    return tuple(lines)


def _tensorflow(diagnosis: Diagnosis) -> dict[str, str]:
    tf = diagnosis.facts.tensorflow
    if tf is None:
        version = diagnosis.facts.versions.get("TensorFlow", Probed(error="not probed"))
        return {"version": version.text(), "build": "not probed (--no-tf)"}
    out = {"version": tf.version.text()}
    build = tf.build.value if tf.build.ok else None
    if build is None:
        out["build"] = tf.build.text()
    elif not build.is_cuda_build:
        out["build"] = "CPU only"
    else:
        out["build"] = "CUDA"
        out["CUDA (build)"] = build.cuda_version or "unknown"
        out["cuDNN (build)"] = build.cudnn_version or "unknown"
        out["compute capabilities"] = ", ".join(build.compute_capabilities) or "none listed"
    out["cuDNN (loaded)"] = (
        f"{tf.cudnn.value.version} ({tf.cudnn.value.path})"
        if tf.cudnn.ok and tf.cudnn.value is not None else tf.cudnn.text()
    )
    out["GPUs TensorFlow lists"] = (
        str(len(tf.gpus.value)) if tf.gpus.ok and tf.gpus.value is not None else tf.gpus.text()
    )
    if tf.log:
        out["TensorFlow's log"] = " | ".join(tf.log)
    return out


def _environment(resolved: ResolvedSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape TensorFlow, CUDA and NCCL, and the settings file's extras."""
    shown = {
        name: value for name, value in environ.items()
        if name.startswith(REPORTED_PREFIXES) and name not in BY_ENV
    }
    for name, value in resolved.env_file_values.items():
        if name not in BY_ENV and name not in shown:
            shown[name] = value
    return {name: masked(name, shown[name]) for name in sorted(shown)}


def build_report(
    diagnosis: Diagnosis,
    resolved: ResolvedSettings,
    environ: Mapping[str, str] | None = None,
    *,
    strict: bool = False,
) -> BugReport:
    """The bug report for a doctor `diagnosis` made with `resolved` settings. Never raises."""
    environ = os.environ if environ is None else environ
    facts = diagnosis.facts
    snapshot = facts.nvml
    versions = facts.versions
    system = {
        "OS": versions.get("OS", Probed(error="not probed")).text(),
        "Python": f"{platform.python_version()} ({platform.python_implementation()}, "
                  f"{sys.executable})",
        "CPU": probe_cpu(),
        "RAM": probe_memory(),
        "container": "yes" if facts.host.in_container.value else (
            "no" if facts.host.in_container.ok else facts.host.in_container.text()),
    }
    if facts.host.limits is not None:
        system["limits"] = machine_limits.describe(facts.host.limits)
    driver = (
        {"driver": snapshot.driver_version.text(),
         "CUDA (driver supports)": _cuda_of_driver(snapshot.cuda_driver_version),
         "NVML": snapshot.nvml_version.text()}
        if snapshot.listing.available
        else {"driver": f"could not collect ({snapshot.listing.error})"}
    )
    driver.update(_kernel_side(facts))
    settings = {
        name: {"value": masked(name, entry["value"]), "source": entry["source"]}
        for name, entry in resolved.provenance().items()
    }
    return BugReport(
        about=about(environ),
        verdict=diagnosis.verdict(strict),
        system=system,
        tensorflow=_tensorflow(diagnosis),
        driver=driver,
        gpus=_gpu_lines(diagnosis),
        nccl=probe_nccl(),
        packages=probe_package_drift(environ),
        settings=settings,
        environment=_environment(resolved, environ),
        problems=tuple(
            (c.status, c.title, c.found) for c in diagnosis.checks if c.status in ("warn", "error")
        ),
    )


def _kernel_side(facts: Facts) -> dict[str, str]:
    """What the kernel says (the facts that tell NVML's failures apart), where known."""
    host = facts.host.nvidia
    lines: dict[str, str] = {}
    if host.kernel_driver.value:
        lines["kernel module"] = host.kernel_driver.value
    if host.nvml_library.value:
        lines["NVML library"] = host.nvml_library.value
    if host.modules.value:
        lines["modules"] = ", ".join(host.modules.value)
    if host.gpu_bus_ids:
        lines["GPUs on the PCI bus"] = ", ".join(host.gpu_bus_ids)
    for failed in facts.nvml.listing.failed:
        lines[f"GPU {failed.index}"] = f"does not answer NVML: {failed.error}"
    return lines


def _cuda_of_driver(encoded: Probed[int]) -> str:
    from mgpu_env.hardware.compat import cuda_from_nvml

    return cuda_from_nvml(encoded.value) if encoded.ok and encoded.value else encoded.text()
