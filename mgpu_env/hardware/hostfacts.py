"""Facts of the host around the GPUs that neither NVML nor CUDA report: whether Docker can
give containers GPUs, and what stands between GPUs for peer-to-peer copies.

- Docker (`docker_gpu_support`): the NVIDIA runtime in `docker info`, a CDI spec for
  nvidia.com/gpu in /etc/cdi or /var/run/cdi, or `nvidia-container-runtime-hook` on PATH
  (what `--gpus` and compose's `driver: nvidia` use). Without any, Docker refuses the GPU
  compose file: `could not select device driver "" with capabilities: [[gpu]]`
  (NVIDIA/nvidia-docker#1352).
- P2P (`p2p_host`): IOMMU groups (/sys/kernel/iommu_groups), the kernel command line
  (iommu=, intel_iommu=, amd_iommu=, pci=noacs), ACS enabled on the PCI bridges above the GPUs
  (/sys/bus/pci/devices/*/config: extended configuration space, readable by root only), and
  a hypervisor (/proc/cpuinfo's `hypervisor` flag). With the IOMMU translating, ACS
  redirecting, or GPUs passed into a VM, NVLink-less P2P can hang NCCL while NVML reports it
  supported (tensorflow#44976, NVIDIA/nccl#631, #2079).

Every probe is a small function with paths as arguments (tests give them a fake /sys), never
raises, and needs no root: what it cannot read is "could not collect (why)".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import Probed, probe

DOCKER_TIMEOUT_S = 4.0
CDI_FOLDERS = (Path("/etc/cdi"), Path("/var/run/cdi"))
HOOK = "nvidia-container-runtime-hook"


@dataclass(frozen=True)
class DockerGpu:
    """What lets this Docker give containers GPUs."""

    runtimes: tuple[str, ...] = ()  # `docker info`'s runtimes
    cdi_specs: tuple[str, ...] = ()  # CDI spec files that name nvidia.com/gpu
    hook: str | None = None  # nvidia-container-runtime-hook on PATH
    docker: str | None = None  # the docker client's file (a snap's cannot use the toolkit)

    @property
    def ready(self) -> bool:
        return "nvidia" in self.runtimes or bool(self.cdi_specs) or self.hook is not None


def run_docker_info(docker: str, timeout_s: float = DOCKER_TIMEOUT_S) -> str:
    """`docker info --format '{{json .Runtimes}}'`. Replaced in tests."""
    done = subprocess.run([docker, "info", "--format", "{{json .Runtimes}}"],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no answer"])[-1])
    return done.stdout


def cdi_specs(folders: Iterable[Path] | None = None) -> tuple[str, ...]:
    """CDI spec files that describe NVIDIA GPUs (`nvidia-ctk cdi generate` writes them)."""
    found = []
    for folder in [host_path(str(f)) for f in CDI_FOLDERS] if folders is None else folders:
        for spec in sorted(folder.glob("*")) if folder.is_dir() else ():
            try:
                if spec.suffix in (".yaml", ".yml", ".json") and "nvidia.com" in spec.read_text(
                        errors="replace"):
                    found.append(str(spec))
            except OSError:
                continue
    return tuple(found)


def docker_gpu_support(path: str | None = None) -> Probed[DockerGpu]:
    """How this host's Docker gives containers GPUs; an error when docker does not answer."""

    def collect() -> DockerGpu:
        docker = shutil.which("docker", path=path)
        specs = cdi_specs()
        hook = shutil.which(HOOK, path=path)
        if docker is None:
            raise RuntimeError("no docker command on PATH")
        runtimes = tuple(sorted(json.loads(run_docker_info(docker) or "{}")))
        return DockerGpu(runtimes, specs, hook, os.path.realpath(docker))

    return probe(collect)


# ------------------------------------------------------------------------------- P2P


@dataclass(frozen=True)
class P2pHost:
    """What the host says about peer-to-peer traffic between GPUs."""

    iommu_groups: Probed[int] = field(default_factory=Probed)  # 0: no IOMMU translating
    cmdline: Probed[str] = field(default_factory=Probed)  # the IOMMU/ACS words of it
    hypervisor: Probed[bool] = field(default_factory=Probed)
    # PCI bridges above the GPUs with ACS redirecting peer traffic (ReqRedir/CmpltRedir).
    acs_bridges: Probed[tuple[str, ...]] = field(default_factory=Probed)

    @property
    def iommu_translates(self) -> bool:
        """IOMMU groups exist and the command line does not put it in pass-through."""
        words = (self.cmdline.value or "").split()
        passthrough = any(w in ("iommu=pt", "iommu=off", "intel_iommu=off", "amd_iommu=off")
                          for w in words)
        return bool(self.iommu_groups.value) and not passthrough


IOMMU_WORDS = ("iommu", "intel_iommu", "amd_iommu", "pci", "vfio")


def iommu_groups(root: Path | None = None) -> Probed[int]:
    def count() -> int:
        folder = root or host_path("/sys/kernel/iommu_groups")
        return len(list(folder.iterdir())) if folder.is_dir() else 0

    return probe(count)


def kernel_cmdline(path: Path | None = None) -> Probed[str]:
    return probe(lambda: " ".join(
        w for w in (path or host_path("/proc/cmdline")).read_text().split()
        if w.split("=")[0].split(".")[0] in IOMMU_WORDS))


def hypervisor(cpuinfo: Path | None = None) -> Probed[bool]:
    def flag() -> bool:
        for line in (cpuinfo or host_path("/proc/cpuinfo")).read_text().splitlines():
            if line.startswith("flags"):
                return "hypervisor" in line.split(":", 1)[1].split()
        return False

    return probe(flag)


_ACS_ID = 0x000D
_REQ_REDIR, _CMPLT_REDIR = 0x04, 0x08


def acs_redirecting(config: bytes) -> bool | None:
    """Whether a PCI function's ACS control redirects requests or completions upstream;
    None when its extended configuration space cannot be read (not root)."""
    if len(config) <= 256:
        return None
    offset = 0x100
    seen = set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header & 0xFFFF == _ACS_ID:
            control = int.from_bytes(config[offset + 6:offset + 8], "little")
            return bool(control & (_REQ_REDIR | _CMPLT_REDIR))
        offset = (header >> 20) & 0xFFC
    return False


def bridges_above(bus_id: str, devices: Path | None = None) -> list[Path]:
    """The PCI bridges between the root complex and the GPU at `bus_id` (nearest last)."""
    devices = devices or host_path("/sys/bus/pci/devices")
    address = bus_id.lower()
    if address.count(":") == 2 and len(address.split(":")[0]) == 8:
        address = address[4:]  # NVML's 00000000:17:00.0 -> sysfs 0000:17:00.0
    real = (devices / address).resolve()
    return [p for p in real.parents if p.name.count(":") == 2 and "." in p.name]


def acs_bridges(bus_ids: Iterable[str],
                devices: Path | None = None) -> Probed[tuple[str, ...]]:
    def collect() -> tuple[str, ...]:
        found: list[str] = []
        unreadable = False
        for bus_id in bus_ids:
            for bridge in bridges_above(bus_id, devices):
                try:
                    redirecting = acs_redirecting((bridge / "config").read_bytes())
                except OSError:
                    redirecting = None
                if redirecting is None:
                    unreadable = True
                elif redirecting and bridge.name not in found:
                    found.append(bridge.name)
        if unreadable and not found:
            raise PermissionError("the bridges' extended PCI configuration is readable by "
                                  "root only (`sudo lspci -vvv | grep ACSCtl` shows it)")
        return tuple(found)

    return probe(collect)


def p2p_host(bus_ids: Iterable[str]) -> P2pHost:
    return P2pHost(iommu_groups(), kernel_cmdline(), hypervisor(), acs_bridges(bus_ids))
