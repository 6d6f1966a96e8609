"""The host's NVIDIA GPUs, as a container without them still sees them.

The host's NVIDIA GPUs as a container without them still sees them, and which compose file
started the container.

A container started without the NVIDIA runtime has no `/dev/nvidia*` and no NVML, so it
cannot list the GPUs; but the kernel's view is not namespaced: the driver's
`/proc/driver/nvidia/gpus/<bus id>/` folders, and the PCI devices in `/sys/bus/pci/devices`
(vendor 0x10de, display class 0x03), are there in any container Docker starts (neither is
in its masked paths). Counting them tells "no GPU on this machine" from "GPUs the container
was not given", which is what a container started with the CPU compose file on a GPU host
needs to say.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mgpu_env.hardware import nvidiahost
from mgpu_env.hardware.hostroot import host_root

# Set by the compose files: `cpu` in docker-compose.yml, `gpu` once docker-compose.gpu.yml
# is added (which also sets MGPU_COMPOSE_GPU=1, what the doctor read first).
COMPOSE_VARIABLE = "MGPU_COMPOSE"
GPU_COMPOSE_FILES = "docker-compose.yml:docker-compose.gpu.yml"


def host_nvidia_gpus(root: Path | None = None) -> int:
    """How many NVIDIA GPUs the machine has, seen from here, with or without NVML: the
    driver's /proc entries, else the PCI devices (`nvidiahost` reads both). 0 when neither
    can be read."""
    root = host_root() if root is None else root
    try:
        listed = nvidiahost.proc_gpus(root)
    except OSError:
        listed = ()
    if listed:
        return len(listed)
    try:
        return len(nvidiahost.pci_gpus(root))
    except OSError:
        return 0


def compose_file_kind(environ: Mapping[str, str]) -> str | None:
    """`cpu` or `gpu`: the compose file that started this container; None outside compose."""
    value = environ.get(COMPOSE_VARIABLE, "").strip().lower()
    return value if value in ("cpu", "gpu") else None


def gpus_left_outside(environ: Mapping[str, str], gpus_here: int, host_gpus: int) -> str | None:
    """The message for a container started with the CPU compose file on a host with GPUs
    (None when that is not the case): what happened, and the fix."""
    if compose_file_kind(environ) != "cpu" or gpus_here or not host_gpus:
        return None
    return (
        f"this container has no GPU, but the host has {host_gpus} NVIDIA GPU(s): it was "
        "started with the CPU compose file (docker-compose.yml alone), so it runs on the "
        "CPU. Fix: `make docker-train` (it picks the GPU file), or set "
        f"COMPOSE_FILE={GPU_COMPOSE_FILES} in .env (needs the NVIDIA Container Toolkit); "
        "GPUS=none says you meant the CPU"
    )
