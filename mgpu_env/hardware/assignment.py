"""The GPUs this job was given before mgpu chose any.

What a scheduler, an orchestrator or a container runtime told it, each read as the untrusted
text it is.

- Slurm: `SLURM_STEP_GPUS` (a step's), else `SLURM_JOB_GPUS`: the node's GPU indices as
  gres.conf names them (the minors of /dev/nvidia<N>); `GPU_DEVICE_ORDINAL` counts within
  what the job sees, as CUDA_VISIBLE_DEVICES does;
- Kubernetes's device plugin and Docker (`--gpus`): `NVIDIA_VISIBLE_DEVICES`, host indices or
  UUIDs (or all, none, void), which the container runtime turns into the container's
  /dev/nvidia* files;
- `CUDA_VISIBLE_DEVICES` as the job started: indices or UUID prefixes of what NVML lists.

`read` returns each one that is set; `doctor.chain` maps them onto the GPUs it counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SLURM_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
CONTAINER_VARIABLE = "NVIDIA_VISIBLE_DEVICES"
VARIABLES = (*SLURM_VARIABLES, "GPU_DEVICE_ORDINAL", CONTAINER_VARIABLE, "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Assignment:
    """One source's GPUs. `ids` None: all of them; `numbering`: "minor" (the node's, as
    /dev/nvidia<N>), "host" (the host's NVML index or a UUID), "visible" (an index or UUID of
    what this process's NVML lists). `error`: the value cannot be read."""

    variable: str
    value: str
    source: str
    numbering: str
    ids: tuple[str, ...] | None = None
    error: str | None = None

    @property
    def said(self) -> str:
        return f"{self.variable}={self.value}"


def _items(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _slurm(environ: Mapping[str, str]) -> Assignment | None:
    for variable in SLURM_VARIABLES:
        value = environ.get(variable)
        if value is None:
            continue
        ids = _items(value)
        bad = [i for i in ids if not i.isdigit()]
        error = (f"{variable}={value!r} holds {bad[0]!r}, not a GPU index (Slurm writes the "
                 "node's indices, as 0,1)") if bad else None
        return Assignment(variable, value, "Slurm", "minor", ids, error)
    return None


def _container(environ: Mapping[str, str], in_container: bool) -> Assignment | None:
    value = environ.get(CONTAINER_VARIABLE)
    if value is None or not in_container:
        return None  # on a host it is only a variable: no runtime acted on it
    source = "Kubernetes" if environ.get("KUBERNETES_SERVICE_HOST") else "the container"
    word = value.strip().lower()
    if word == "all":
        return Assignment(CONTAINER_VARIABLE, value, source, "host", None)
    if word in ("", "none", "void"):
        return Assignment(CONTAINER_VARIABLE, value, source, "host", ())
    return Assignment(CONTAINER_VARIABLE, value, source, "host", _items(value))


def _visible(environ: Mapping[str, str]) -> Assignment | None:
    for variable, source in (("CUDA_VISIBLE_DEVICES", "the job's environment"),
                             ("GPU_DEVICE_ORDINAL", "Slurm")):
        value = environ.get(variable)
        if value is not None:
            ids = _items(value)
            if value.strip() in ("", "-1") or (ids and ids[0] == "-1"):
                ids = ()
            return Assignment(variable, value, source, "visible", ids)
    return None


def read(environ: Mapping[str, str], *, in_container: bool) -> tuple[Assignment, ...]:
    """Every assignment the environment carries, the narrowest last."""
    found = (_container(environ, in_container), _slurm(environ), _visible(environ))
    return tuple(a for a in found if a is not None)
