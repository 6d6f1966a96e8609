"""Canned doctor facts: fake TensorFlow answers, a healthy host, versions (no GPU needed)."""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor import gather
from mgpu_env.doctor.diagnosis import ChildProbes
from mgpu_env.doctor.facts import Facts, HostFacts
from mgpu_env.hardware import cudalibs, nvml
from mgpu_env.hardware.cudadriver import DriverApi
from mgpu_env.hardware.cudalibs import CudaStack, CudaTool, LoadedLibrary
from mgpu_env.hardware.dockerhost import DaemonInfo, DockerHost
from mgpu_env.hardware.hostfacts import P2pHost
from mgpu_env.hardware.nvml import Probed
from mgpu_env.tfprobes.tfprobe import CudnnLibrary, TfBuildInfo, TfFacts
from tests.support.fakelimits import healthy_limits

TF_221_CAPABILITIES = ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90")
GIB = 1024**3


def tf_facts(
    gpus: int = 0,
    *,
    cuda_build: bool = True,
    capabilities: tuple[str, ...] = TF_221_CAPABILITIES,
    cudnn: str | None = "9.3.0",
    version: str = "2.21.0",
) -> TfFacts:
    build = TfBuildInfo(
        is_cuda_build=cuda_build,
        cuda_version="12.5.1" if cuda_build else None,
        cudnn_version="9" if cuda_build else None,
        compute_capabilities=capabilities if cuda_build else (),
    )
    return TfFacts(
        version=Probed(value=version),
        build=Probed(value=build),
        gpus=Probed(value=tuple(f"/physical_device:GPU:{i}" for i in range(gpus))),
        cudnn=(
            Probed(value=CudnnLibrary(cudnn, "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"))
            if cudnn else Probed(error="no cuDNN library found (tried libcudnn.so.9)")
        ),
    )


WHEELS = "/venv/lib/python3.12/site-packages/nvidia"
VERSIONS = {"cudart": "12.5", "cudnn": "9.3.0", "nccl": "2.27.7"}


def cuda_stack(
    *,
    missing: tuple[str, ...] = (),
    cudnn: str = "9.3.0",
    nccl: str = "2.27.7",
    ptxas: str | None = "12.5.82",
    libdevice: bool = True,
) -> CudaStack:
    """The CUDA user space as the CUDA lock installs it, with `missing` libraries hidden."""
    versions = dict(VERSIONS, cudnn=cudnn, nccl=nccl)
    libraries: dict[str, Probed[LoadedLibrary]] = {}
    for library in cudalibs.LIBRARIES:
        folder = f"{WHEELS}/{library.package}/lib"
        libraries[library.name] = (
            Probed(error=f"{library.soname} is not in LD_LIBRARY_PATH, {folder} or the "
                         "system loader's folders")
            if library.name in missing
            else Probed(value=LoadedLibrary(f"{folder}/{library.soname}", "wheel",
                                            versions.get(library.name)))
        )
    nvcc = f"{WHEELS}/cuda_nvcc"
    return CudaStack(
        libraries=libraries,
        ptxas=(Probed(value=CudaTool(f"{nvcc}/bin/ptxas", ptxas)) if ptxas
               else Probed(error=f"no usable ptxas (looked in XLA's order: PATH, then "
                                 f"/usr/local/cuda/bin, {nvcc}/bin)")),
        libdevice=(Probed(value=f"{nvcc}/nvvm/libdevice/libdevice.10.bc") if libdevice
                   else Probed(error="no nvvm/libdevice folder (looked in XLA's order: "
                                     f"/usr/local/cuda/nvvm/libdevice, {nvcc}/nvvm/libdevice)")),
        wheel_root=WHEELS,
    )


def driver_api(
    environ: Mapping[str, str] | None = None, *, init_code: int = 0,
    library: str | None = "/usr/lib/x86_64-linux-gnu/libcuda.so.555.42.06",
    driver_version: int = 12050, device_count: int | None = None,
) -> Probed[DriverApi]:
    """CUDA's driver API as a healthy driver answers; the GPU count follows
    CUDA_VISIBLE_DEVICES when it is set (None: not compared)."""
    if device_count is None and environ and "CUDA_VISIBLE_DEVICES" in environ:
        visible = environ["CUDA_VISIBLE_DEVICES"].strip()
        device_count = 0 if visible in ("", "-1") else len(visible.split(","))
    return Probed(value=DriverApi(
        library=library, load_error=None if library else "libcuda.so.1: cannot open shared "
        "object file: No such file or directory", driver_version=driver_version if library
        else None, init_code=init_code if library else None,
        device_count=device_count if init_code == 0 and library else None))


def p2p_host(*, iommu_groups: int = 0, cmdline: str = "", hypervisor: bool = False,
             acs: tuple[str, ...] = ()) -> P2pHost:
    """What the host says about P2P: by default nothing in the way."""
    return P2pHost(Probed(value=iommu_groups), Probed(value=cmdline), Probed(value=hypervisor),
                   Probed(value=acs))


def docker_gpu(*, runtimes: tuple[str, ...] = ("io.containerd.runc.v2", "nvidia", "runc"),
               hook: str | None = None, docker: str = "/usr/bin/docker") -> DockerHost:
    """A rootful Docker 27 with the cgroupfs driver and the given runtimes (the tests of
    Docker's host side lay out a machine and a `docker` command instead)."""
    info = DaemonInfo("27.3.1", False, "cgroupfs", "2", tuple(sorted(runtimes)), "runc")
    return DockerHost(docker=docker, info=Probed(value=info), hook=hook)


def healthy_host(**changes: object) -> HostFacts:
    values: dict[str, object] = {
        "in_container": Probed(value=True),
        "device_files": Probed(value=("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")),
        "euid": Probed(value=1000),
        "wsl_gpu": Probed(value=False),
        "nvidia_modules": Probed(value=("nvidia", "nvidia_modeset", "nvidia_uvm")),
        # /proc/self/limits, the cgroup, /dev/shm ... of a healthy machine, read by the probe.
        "limits": healthy_limits(),
    }
    values.update(changes)
    return HostFacts(**values)  # type: ignore[arg-type]


def versions(python: str = "3.12.3", tensorflow: str = "2.21.0") -> dict[str, Probed[str]]:
    return {
        "Python": Probed(value=python),
        "TensorFlow": Probed(value=tensorflow),
        "Keras": Probed(value="3.15.1"),
        "NumPy": Probed(value="2.4.6"),
        "nvidia-ml-py": Probed(value="13.615.71"),
        "OS": Probed(value="Ubuntu 24.04 LTS"),
    }


def make_facts(
    gpus_setting: str = "all",
    *,
    tf: TfFacts | None = None,
    host: HostFacts | None = None,
    environ: Mapping[str, str] | None = None,
    mixed_precision: str = "0",
    python: str = "3.12.3",
    cuda: CudaStack | None = None,
    xla: bool = False,
    cross_device_ops: str = "auto",
    settings: Mapping[str, str] | None = None,
) -> Facts:
    """Facts from whatever NVML `nvml.load_library` gives (install a fake first)."""
    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probes, "probe_host", lambda: host or healthy_host())
        patch.setattr(probes, "probe_versions", lambda: versions(python=python))
        return gather(
            resolve_settings({"GPUS": gpus_setting, "MIXED_PRECISION": mixed_precision,
                              "XLA": "1" if xla else "0",
                              "CROSS_DEVICE_OPS": cross_device_ops, **(settings or {})},
                             {}),
            dict(environ or {}),
            with_tensorflow=tf is not None,
            children=ChildProbes(
                tensorflow=(lambda env: tf) if tf is not None else None,  # type: ignore[arg-type,return-value]
                cuda=lambda env: cuda or cuda_stack()),
        )


__all__ = [
    "GIB",
    "cuda_stack",
    "docker_gpu",
    "driver_api",
    "healthy_host",
    "make_facts",
    "nvml",
    "p2p_host",
    "tf_facts",
    "versions",
]
