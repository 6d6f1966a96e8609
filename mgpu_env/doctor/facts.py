"""The facts `mgpu doctor` judges, gathered in one typed record by small replaceable probes.

Each probe is a module-level function that never raises: a failure becomes a `Probed`
with an error ("could not collect ..."). Tests build `Facts` directly, or replace a probe
with `monkeypatch.setattr(facts, "probe_host", ...)`. What training decides (the GPUs,
the cluster, the Keras, the precision) is not probed here: it is read from the runtime's
record (`runtime.record.decide`), with why a part could not be decided.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgpu_env.config.settings import GpuRequest, Settings
from mgpu_env.hardware import (
    devopen,
    hostfacts,
    hostgpus,
    hostroot,
    ncclenv,
    nvidiahost,
    nvml,
)
from mgpu_env.hardware import limits as machine_limits
from mgpu_env.hardware.cudadriver import DriverApi
from mgpu_env.hardware.cudalibs import CudaStack
from mgpu_env.hardware.devices import GpuSelection
from mgpu_env.hardware.folders import FolderAccess, folder_access
from mgpu_env.hardware.hostfacts import P2pHost
from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import GpuInfo, Probed, probe
from mgpu_env.runtime.cluster import ClusterDecision
from mgpu_env.runtime.cluster.peers import PeerStatus, probe_peers
from mgpu_env.runtime.keras import LEGACY_VARIABLE, KerasChoice
from mgpu_env.runtime.precision import PrecisionChoice
from mgpu_env.runtime.runfolder import run_folder
from mgpu_env.tfprobes.tfprobe import TfFacts

if TYPE_CHECKING:  # Docker's host probe is imported where it runs: on a host, rarely
    from mgpu_env.hardware.dockerhost import DockerHost

# Environment variables the report shows as they were before mgpu changed anything.
REPORTED_VARIABLES = (
    "GPUS",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",  # compute and utility: libcuda.so.1 and NVML in a container
    "CUDA_DEVICE_ORDER",
    "MGPU_COMPOSE_GPU",  # set by docker-compose.gpu.yml: the GPUs were meant to be there
    "MGPU_COMPOSE",  # cpu or gpu: the compose file that started the container
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    # TensorFlow's pool sizes where the user set them (the thread-limit check's demand).
    "TF_NUM_INTEROP_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    LEGACY_VARIABLE,
    # Where the dynamic loader looks first, and a conda environment that may have set it.
    "LD_LIBRARY_PATH",
    "CONDA_PREFIX",
    "COMPOSE_FILE",  # docker-compose.gpu.yml selected on a host: Docker must have the runtime
    # The GPUs a scheduler or orchestrator gave the job (hardware.assignment).
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "GPU_DEVICE_ORDINAL",
    "KUBERNETES_SERVICE_HOST",
)
# Distributions whose versions the report lists, by display name.
DISTRIBUTIONS = {
    "TensorFlow": "tensorflow",
    "Keras": "keras",
    "tf_keras": "tf-keras",
    "NumPy": "numpy",
    "nvidia-ml-py": "nvidia-ml-py",
}


@dataclass(frozen=True)
class HostFacts:
    """The machine or container around the GPUs."""

    in_container: Probed[bool] = field(default_factory=lambda: Probed(value=False))
    # /dev/nvidia* device files (nvidiactl, nvidia0, ...): the Container Toolkit adds them.
    device_files: Probed[tuple[str, ...]] = field(default_factory=lambda: Probed(value=()))
    # The machine's NVIDIA GPUs by the kernel's /proc and /sys, which a container without
    # the NVIDIA runtime still sees (hardware.hostgpus).
    host_gpus: Probed[int] = field(default_factory=lambda: Probed(value=0))
    euid: Probed[int] = field(default_factory=Probed)
    # /dev/dxg: WSL2's GPU device; there the GPU comes without any /dev/nvidia* file.
    wsl_gpu: Probed[bool] = field(default_factory=lambda: Probed(value=False))
    # The NVIDIA kernel modules loaded (/proc/modules: the host's, also from a container).
    nvidia_modules: Probed[tuple[str, ...]] = field(default_factory=Probed)
    # What tells NVML's failures apart: the kernel module's version against the NVML
    # library's, nouveau, the GPUs on the PCI bus, /dev/nvidia* permissions, the groups.
    nvidia: nvidiahost.NvidiaHost = field(default_factory=nvidiahost.NvidiaHost)
    # The process's, cgroup's and kernel's limits, /dev/shm, memory and CPUs (hardware.limits);
    # None: not read (the limit checks skip).
    limits: machine_limits.MachineLimits | None = None


@dataclass(frozen=True)
class ClusterFacts:
    """The cluster training would join (None: one process), or why none can be made, and
    what probing each peer found."""

    cluster: dict[str, Any] | None = None  # Cluster.describe()
    engine_name: str = ""
    address: str = ""
    notes: tuple[str, ...] = ()
    error: str | None = None  # the engines' variables contradict each other
    peers: tuple[PeerStatus, ...] = ()


@dataclass(frozen=True)
class KerasFacts:
    """The Keras `tf.keras` would be for a script under `mgpu run` and for `mgpu train`'s
    loop (they differ only between workers), or why KERAS cannot work here."""

    run: KerasChoice | None = None
    train: KerasChoice | None = None
    error: str | None = None  # KERAS=2 (or TF_USE_LEGACY_KERAS=1) without tf_keras


@dataclass(frozen=True)
class NcclFacts:
    """The NCCL_* variables as the user set them, and what they may name on this machine."""

    environ: dict[str, str] = field(default_factory=dict)
    interfaces: tuple[str, ...] = ()  # /sys/class/net
    hcas: tuple[str, ...] = ()  # /sys/class/infiniband


@dataclass(frozen=True)
class Facts:
    """Everything the checks look at. `tensorflow` is None when its probe was skipped."""

    request: GpuRequest
    nvml: nvml.NvmlSnapshot
    selection: GpuSelection | None  # None: GPUS does not fit the machine (selection_error)
    selection_error: str | None
    environ: dict[str, str]  # REPORTED_VARIABLES as the user set them
    host: HostFacts
    versions: dict[str, Probed[str]]  # display name -> version (Python, TensorFlow, ..., OS)
    tensorflow: TfFacts | None = None
    mixed_precision: str = "0"
    # The precision training decided for the selected devices, or why MIXED_PRECISION
    # cannot work there (both None: no GPU selection to decide it on).
    precision: PrecisionChoice | None = None
    precision_error: str | None = None
    # The CUDA libraries, ptxas and libdevice as TensorFlow would find them; None: not
    # probed (--no-tf, or the pre-flight with no GPU).
    cuda: CudaStack | None = None
    xla: bool = False
    cross_device_ops: str = "auto"
    cluster: ClusterFacts = field(default_factory=ClusterFacts)
    run_folder: FolderAccess | None = None  # None: not probed (the pre-flight)
    keras: KerasFacts = field(default_factory=KerasFacts)
    # CUDA's driver API (cuInit) in a child with the run's environment; None: not probed
    # (no GPU from NVML, GPUS=none, or the pre-flight).
    cuda_driver: Probed[DriverApi] | None = None
    # Docker's host side (the daemon, the NVIDIA toolkit's settings, CDI), read on a host
    # where the GPU compose file is selected (COMPOSE_FILE); None: not asked.
    docker: DockerHost | None = None
    # IOMMU, ACS, hypervisor: what can break P2P between GPUs; None: fewer than 2 GPUs.
    p2p: P2pHost | None = None
    # NCCL's variables and the interfaces and HCAs they may name; None: not probed.
    nccl: NcclFacts | None = None
    # The names (/proc/<pid>/comm) of the processes NVML says hold GPU memory, where this
    # process can see them (another container's pids are not in this /proc).
    process_names: dict[int, str] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self.nvml.listing.gpus

    @property
    def selected(self) -> tuple[GpuInfo, ...]:
        return self.selection.gpus if self.selection is not None else ()


# ------------------------------------------------------------------------------ probes


def probe_in_container() -> Probed[bool]:
    def detect() -> bool:
        if host_path("/.dockerenv").exists() or host_path("/run/.containerenv").exists():
            return True
        try:
            cgroup = host_path("/proc/1/cgroup").read_text()
        except OSError:
            return False
        return any(word in cgroup for word in ("docker", "containerd", "kubepods", "libpod"))

    return probe(detect)


def probe_device_files(dev: Path | None = None) -> Probed[tuple[str, ...]]:
    return probe(lambda: tuple(sorted(p.name for p in (dev or host_path("/dev")).glob("nvidia*"))))


def probe_limits() -> machine_limits.MachineLimits:
    return machine_limits.collect()


def probe_wsl_gpu(dev: Path | None = None) -> Probed[bool]:
    return probe(lambda: ((dev or host_path("/dev")) / "dxg").exists())


def probe_nvidia_modules(path: Path | None = None) -> Probed[tuple[str, ...]]:
    """The loaded kernel modules whose name starts with nvidia (nvidia, nvidia_uvm, ...)."""
    return probe(lambda: tuple(sorted(
        line.split()[0] for line in (path or host_path("/proc/modules")).read_text().splitlines()
        if line.startswith("nvidia")
    )))


GPU_COMPOSE_FILE = "docker-compose.gpu.yml"


def gpu_compose_selected(environ: Mapping[str, str], env_file: Mapping[str, str]) -> bool:
    """Whether COMPOSE_FILE (the environment's, else .env's) includes the GPU compose file."""
    return GPU_COMPOSE_FILE in environ.get("COMPOSE_FILE", env_file.get("COMPOSE_FILE", ""))


def probe_docker() -> DockerHost:
    from mgpu_env.hardware import dockerhost

    return dockerhost.collect()


def probe_p2p(bus_ids: tuple[str, ...]) -> P2pHost:
    return hostfacts.p2p_host(bus_ids)


def probe_euid() -> Probed[int]:
    """Who this process runs as, by /proc/self/status (under MGPU_HOST_ROOT)."""
    return probe(lambda: devopen.identity().uid)


def probe_host() -> HostFacts:
    return HostFacts(
        in_container=probe_in_container(),
        device_files=probe_device_files(),
        host_gpus=probe(hostgpus.host_nvidia_gpus),
        euid=probe_euid(),
        wsl_gpu=probe_wsl_gpu(),
        nvidia_modules=probe_nvidia_modules(),
        nvidia=probe_nvidia_host(),
        limits=probe_limits(),
    )


def probe_nvidia_host() -> nvidiahost.NvidiaHost:
    """After NVML was asked (its library is then mapped): see `nvidiahost`."""
    return nvidiahost.collect()


def _os_name() -> str:
    name = ""
    try:
        # os-release(5): KEY="value" lines; the machine's, under MGPU_HOST_ROOT too.
        for line in host_path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("PRETTY_NAME", "NAME") and not name:
                name = value.strip().strip('"')
    except (OSError, ValueError):
        name = ""
    return f"{name or platform.system()} (kernel {platform.release()}, {platform.machine()})"


def probe_versions() -> dict[str, Probed[str]]:
    """Versions from package metadata: nothing is imported, so this is instant."""
    versions: dict[str, Probed[str]] = {
        "Python": Probed(value=platform.python_version()),
    }
    for display, distribution in DISTRIBUTIONS.items():
        versions[display] = probe(lambda d=distribution: metadata.version(d))  # type: ignore[misc]
    versions["OS"] = probe(_os_name)
    return versions


def probe_cluster(decision: ClusterDecision | None, error: str | None) -> ClusterFacts:
    """The cluster training decided (None: its engines' variables contradict each other,
    `error` says how), each peer resolved and reached."""
    if decision is None:
        return ClusterFacts(error=error)
    cluster = decision.cluster
    if cluster is None:
        return ClusterFacts(notes=decision.notes)
    return ClusterFacts(
        cluster.describe(), cluster.engine_name, cluster.address, decision.notes,
        peers=tuple(probe_peers(cluster.workers, cluster.address)),
    )


def probe_run_folder(settings: Settings) -> FolderAccess:
    """Whether the folder `mgpu train` would write (`runtime.runfolder`) can be written."""
    return folder_access(run_folder(settings))


def probe_nccl(environ: Mapping[str, str], root: Path | None = None) -> NcclFacts:
    """NCCL's variables, and the interfaces and HCAs under the host root's /sys."""
    root = hostroot.host_root() if root is None else root
    return NcclFacts({k: v for k, v in environ.items() if k.startswith("NCCL_")},
                     ncclenv.interfaces(root), ncclenv.hcas(root))


def probe_process_names(snapshot: nvml.NvmlSnapshot) -> dict[int, str]:
    """Each GPU-holding process's name, by pid, as /proc/<pid>/comm says it."""
    names: dict[int, str] = {}
    for gpu in snapshot.listing.gpus:
        for pid, _ in gpu.process_memory.value or ():
            try:
                names[pid] = host_path(f"/proc/{int(pid)}/comm").read_text().strip()[:64]
            except (OSError, ValueError):
                continue
    return names


def reported_environ(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in REPORTED_VARIABLES if k in environ}
