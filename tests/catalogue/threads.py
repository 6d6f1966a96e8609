"""The catalogue of real failures: one entry per public bug thread the doctor is meant to
catch, as data. Each says what the user saw, how this machine simulates it (`Scenario`), and
what the doctor must say: which check flags it (`check`, `status`), the words that name the
cause (`cause`), and the fix the thread converged on, as the doctor prints it (`fix`, with
`{tmp}` and `{site}` for the simulation's folders).

`tests/processes/test_doctor_catalogue.py` runs every entry; `docs/troubleshooting.md` is
written from it (`python -m tests.catalogue.docs`) and tested against it, so the two never
disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The doctor's fixes, whole, as it prints them (kept here as text, so that this file also
# loads on older code, and so that a change of wording shows here and in the docs).
FIX_UVM = (
    "load the CUDA unified-memory module and its device file: `sudo nvidia-modprobe -u -c=0` "
    "(or `sudo modprobe nvidia_uvm`); after a suspend: `sudo rmmod nvidia_uvm && sudo "
    "modprobe nvidia_uvm`, or reboot"
)
FIX_UVM_CONTAINER = (
    "the container has no /dev/nvidia-uvm: on the host run `sudo nvidia-modprobe -u -c=0` "
    "(it creates /dev/nvidia-uvm), then recreate the container (`docker compose up "
    "--force-recreate`); with a runtime that does not add it: `--device /dev/nvidia-uvm "
    "--device /dev/nvidia-uvm-tools`"
)
FIX_COMPAT = (
    "remove the CUDA forward-compatibility folder (`.../cuda/compat`, `.../cuda-12.x/compat`) "
    "from LD_LIBRARY_PATH so that the driver's own libcuda.so.1 loads: forward compatibility "
    "works only on data-centre GPUs with a matching driver branch"
)
FIX_NO_DEVICE = (
    "unset CUDA_VISIBLE_DEVICES (GPUS chooses the GPUs); in a container start it with the "
    "GPUs (`--gpus all`); on a host check `nvidia-smi`"
)
FIX_MISMATCH = (
    "the NVIDIA kernel module and its libcuda.so.1 are of different driver versions (an "
    "upgrade without a reboot): reboot, or reload the modules (`sudo rmmod nvidia_uvm "
    "nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`)"
)
FIX_DRIVER_UPGRADE = (
    "upgrade the host's NVIDIA driver to 555.42.06 or newer (a container uses the host's)"
)
FIX_BUSY = (
    "exclusive-process mode and 1 process(es) already use it (all CUDA-capable devices are "
    "busy or unavailable): stop them (`nvidia-smi` lists them), choose other GPUs, or "
    "`sudo nvidia-smi -i 0 -c DEFAULT`"
)
FIX_EXCLUSIVE_THREAD = (
    "exclusive-thread compute mode, which TensorFlow cannot use: "
    "`sudo nvidia-smi -i 0 -c DEFAULT`"
)
FIX_FP16_SLOW = (
    "GPU 0 (NVIDIA GeForce GTX 1660 Ti): a GeForce GTX 16xx/MX board has no tensor cores, "
    "and fp16 is slower than float32 there (tensorflow#44191): set MIXED_PRECISION=0"
)
FIX_BLACKWELL = (
    "TensorFlow 2.21's pip wheel cannot run on Blackwell GPUs (compute capability 10.x/12.x): "
    "its kernels fail with CUDA_ERROR_INVALID_PTX; use NVIDIA's NGC TensorFlow container "
    "(nvcr.io/nvidia/tensorflow, a release built with CUDA 12.8 or later), or train on other "
    "GPUs (GPUS=...) or the CPU (GPUS=none)"
)
FIX_NVCC = (
    "install ptxas and libdevice where XLA looks: `make venv CUDA=1` or the image (both carry "
    "nvidia-cuda-nvcc-cu12 12.5.*), or point XLA at a CUDA toolkit: "
    "XLA_FLAGS=--xla_gpu_cuda_data_dir=/usr/local/cuda-12.5"
)
FIX_AND_CUDA = (
    "install the CUDA libraries TensorFlow was built with: `make venv CUDA=1` (the CUDA lock) "
    "or the image (`make build`); by hand: `pip install 'tensorflow[and-cuda]==2.21.0'`"
)
FIX_CUDNN = (
    "install cuDNN 9.3: `make venv CUDA=1` (the CUDA lock), or `pip install "
    "'nvidia-cudnn-cu12==9.3.*'` (part of tensorflow[and-cuda]), or use the image "
    "(`make build`)"
)
FIX_RUNPATH = (
    "install the pinned TensorFlow, whose RUNPATH has them (`pip install -r "
    "requirements.lock`), or put the wheels on the loader's path: `export LD_LIBRARY_PATH="
    + ":".join(f"{{site}}/nvidia/{package}/lib" for package in (
        "cuda_runtime", "nvjitlink", "cublas", "cufft", "curand", "cusparse", "cusolver",
        "cudnn", "nccl")) + "`"
)
FIX_SHADOW = "remove {tmp}/FOLDER from LD_LIBRARY_PATH, and in ~/.bashrc where it is set"
FIX_TOOLKIT = (
    "install the NVIDIA Container Toolkit (https://docs.nvidia.com/datacenter/cloud-native/"
    "container-toolkit/latest/install-guide.html), then `sudo nvidia-ctk runtime configure "
    "--runtime=docker` and `sudo systemctl restart docker`; or set "
    "`COMPOSE_FILE=docker-compose.yml` in .env to run on the CPU"
)
FIX_SNAP = (
    "Docker installed as a snap cannot use the NVIDIA Container Toolkit: remove it (`sudo "
    "snap remove docker`) and install Docker from Docker's apt repository, then the toolkit"
)
FIX_NVML_LOST = (
    "recreate the container (`docker compose up -d --force-recreate`, or stop and start it); "
    "to keep it from recurring, on the host: `sudo nvidia-ctk system create-dev-char-symlinks "
    "--create-all` (or Docker's `\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"]`), as "
    "NVIDIA/nvidia-container-toolkit#48 describes"
)
FIX_P2P = (
    "if the all-reduce hangs or its sums are wrong, set NCCL_P2P_DISABLE=1 (NCCL then copies "
    "through host memory, slower but safe); for P2P at full speed turn the IOMMU to "
    "pass-through (`iommu=pt` on the kernel command line, or VT-d/AMD-Vi off in the BIOS) "
    "and ACS off on the PCIe bridges (BIOS, or `pci=noacs`); `mgpu doctor --smoke` tests "
    "the path"
)
FIX_SHM = (
    "compose: `shm_size: 1gb` (or `ipc: host`) on the service; docker run: --shm-size=1g "
    "(NCCL and tf.data use shared memory)"
)

FIX_NVML_MISMATCH = (
    "reboot (the driver was upgraded without one), or reload the modules: `sudo rmmod "
    "nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`"
)
FIX_DEVICE_GROUP = (
    "add the user to the group video (`sudo usermod -aG video $USER`, then log in again), or "
    "have udev give /dev/nvidia* mode 0666 (the driver's default, `NVreg_DeviceFileMode`)"
)
FIX_GPU_LOST = (
    "the GPU fell off the bus (`sudo dmesg | grep -i xid` shows Xid 79): reboot or power-cycle "
    "the machine; if it recurs, check the GPU's power cables, riser and temperature; "
    "GPUS=0,1,3 trains on the healthy ones meanwhile"
)
FIX_SOCKET_IFNAME = (
    "set NCCL_SOCKET_IFNAME to one of docker0, eno1, lo (a prefix, `=name` for exactly it, "
    "`^name` to leave it out), or unset it"
)
FIX_CAPABILITIES = (
    "start the container with NVIDIA_DRIVER_CAPABILITIES=compute,utility (or `all`): without "
    "`compute` the NVIDIA Container Toolkit mounts no libcuda.so.1, so CUDA cannot start "
    "(docker-compose.gpu.yml sets it)"
)
FIX_TF_IGNORES = "leave it out with GPUS=, or use a TensorFlow built for this GPU"

A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))


@dataclass(frozen=True)
class Scenario:
    """How one failure is simulated here. Real probes run (children, the real loader)
    against gcc-built fakes whenever `libcuda` or `site` is set; NVML is always the fake."""

    gpus: tuple[tuple[str, tuple[int, int]], ...] = (A100, A100)
    nvml: dict[str, Any] = field(default_factory=dict)  # FakeNvml fields (driver, links...)
    gpu: dict[str, Any] = field(default_factory=dict)  # FakeGpu fields for every GPU
    # A fake libcuda.so.1: its cuInit code, in `folder` (under the tmp folder), on
    # LD_LIBRARY_PATH. None: no libcuda.so.1 anywhere.
    libcuda: dict[str, Any] | None = field(default_factory=lambda: {"init_code": 0})
    # site-packages with the stand-in TensorFlow and fake NVIDIA wheels (fakecuda.build_site
    # arguments); None: no TensorFlow probe (canned answers from `canned`).
    site: dict[str, Any] | None = field(default_factory=dict)
    # Folders put on LD_LIBRARY_PATH after the driver's: {folder: {library name: version}};
    # "nvjitlink-12.1" builds an nvJitLink without 12.5's symbols.
    ld_path: dict[str, dict[str, int]] = field(default_factory=dict)
    canned: dict[str, Any] = field(default_factory=dict)  # cuda_stack() args when no site
    host: dict[str, Any] = field(default_factory=dict)  # HostFacts fields (Probed values)
    p2p: dict[str, Any] = field(default_factory=dict)  # fake_doctor.p2p_host arguments
    docker: dict[str, Any] | None = None  # fake_doctor.docker_gpu arguments
    settings: dict[str, str] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    # The machine's /proc, /sys, /dev and /etc/group as a folder (fakemachine.machine_root
    # arguments; the user is uid 1000 in group 1000): the kernel module's version, the
    # NVML library mapped, nouveau, the PCI GPUs, device files, network interfaces.
    # None: not laid out (the probes of older doctors see nothing of it).
    machine: dict[str, Any] | None = None
    # With canned TensorFlow answers: how many GPUs it lists (None: every one NVML lists)
    # and the lines its log has.
    tf_gpus: int | None = None
    tf_log: tuple[str, ...] = ()


@dataclass(frozen=True)
class Thread:
    id: str  # owner/repo#number
    symptom: str  # what the user saw
    simulated: str  # how this machine simulates it
    check: str  # the check that must flag it (an id, or its prefix: "gpu.0")
    status: str  # "error" or "warn"
    cause: tuple[str, ...]  # words the doctor's finding must contain (any flagged check)
    fix: str  # printed by the doctor, whole, in the table and in --json
    scenario: Scenario
    title: str = ""  # the symptom's heading in docs/troubleshooting.md

    @property
    def url(self) -> str:
        repo, number = self.id.split("#")
        return f"https://github.com/{repo}/issues/{number}"


HOST = {"in_container": False}
NO_UVM_HOST = {"in_container": False, "nvidia_modules": ("nvidia", "nvidia_modeset"),
               "device_files": ("nvidia0", "nvidia1", "nvidiactl")}
CONTAINER_NO_UVM = {"in_container": True, "device_files": ("nvidia0", "nvidia1", "nvidiactl")}
PCIE = {"p2p_ok": True, "nvlink": False}
GPU_COMPOSE = {"COMPOSE_FILE": "docker-compose.yml:docker-compose.gpu.yml"}
NVML_UNKNOWN = 999  # pynvml.NVML_ERROR_UNKNOWN


THREADS: tuple[Thread, ...] = (
    # ------------------------------------------------- CUDA's own initialisation (cuInit)
    Thread(
        "tensorflow/tensorflow#53341", "TensorFlow lists no GPU after the laptop resumed "
        "from suspend: `failed call to cuInit: CUDA_ERROR_UNKNOWN: unknown error`",
        "a libcuda.so.1 whose cuInit returns 999 (CUDA_ERROR_UNKNOWN); nvidia_uvm loaded",
        "driver.cuda_init", "error", ("CUDA_ERROR_UNKNOWN", "after a suspend"), FIX_UVM,
        Scenario(libcuda={"init_code": 999}, host=HOST),
        "cuInit fails with CUDA_ERROR_UNKNOWN (after a suspend, or without nvidia_uvm)"),
    Thread(
        "tensorflow/tensorflow#394", "`failed call to cuInit: CUDA_ERROR_UNKNOWN`; "
        "`sudo apt-get install nvidia-modprobe` fixed it",
        "cuInit returns 999; the host has no nvidia_uvm module and no /dev/nvidia-uvm",
        "driver.cuda_init", "error", ("CUDA_ERROR_UNKNOWN", "nvidia_uvm NOT loaded"), FIX_UVM,
        Scenario(libcuda={"init_code": 999}, host=NO_UVM_HOST)),
    Thread(
        "NVIDIA/nvidia-docker#106", "`Error: Could not load UVM kernel module`; "
        "`nvidia-modprobe -u -c=0` fixed it",
        "cuInit returns 999 on a host without nvidia_uvm; one GPU",
        "driver.cuda_init", "error", ("nvidia_uvm NOT loaded", "no /dev/nvidia-uvm"), FIX_UVM,
        Scenario(gpus=(A100,), libcuda={"init_code": 999}, host=NO_UVM_HOST)),
    Thread(
        "NVIDIA/nvidia-docker#997", "CUDA fails in a container started without "
        "/dev/nvidia-uvm; `--device /dev/nvidia-uvm` fixed it",
        "in a container with /dev/nvidia0, /dev/nvidiactl but no /dev/nvidia-uvm; cuInit 999",
        "driver.cuda_init", "error", ("no /dev/nvidia-uvm",), FIX_UVM_CONTAINER,
        Scenario(libcuda={"init_code": 999}, host=CONTAINER_NO_UVM),
        "A container without /dev/nvidia-uvm"),
    Thread(
        "tensorflow/tensorflow#255", "`failed call to cuInit: CUDA_ERROR_NO_DEVICE`",
        "a libcuda.so.1 whose cuInit returns 100 (CUDA_ERROR_NO_DEVICE)",
        "driver.cuda_init", "error", ("CUDA_ERROR_NO_DEVICE", "CUDA sees no GPU"),
        FIX_NO_DEVICE, Scenario(libcuda={"init_code": 100}),
        "cuInit fails with CUDA_ERROR_NO_DEVICE"),
    Thread(
        "NVIDIA/nvidia-docker#1515", "Error 804: forward compatibility was attempted on non "
        "supported HW, after the image's CUDA compat libraries came first",
        "a libcuda.so.1 in usr/local/cuda-12.8/compat, first on LD_LIBRARY_PATH, cuInit 804; "
        "GeForce GPUs",
        "driver.cuda_init", "error", ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
                                      "forward-compatibility library"), FIX_COMPAT,
        Scenario(gpus=(("NVIDIA GeForce RTX 3090", (8, 6)),) * 2,
                 libcuda={"init_code": 804, "folder": "usr/local/cuda-12.8/compat"}),
        "Error 804: forward compatibility on a GPU that does not support it"),
    Thread(
        "tensorflow/tensorflow#4768", "`kernel version 352.63.0 does not match DSO version "
        "361.93.2 -- cannot find working devices`",
        "a libcuda.so.1 whose cuInit returns 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)",
        "driver.cuda_init", "error", ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",),
        FIX_MISMATCH, Scenario(libcuda={"init_code": 803}),
        "libcuda.so.1 does not match the kernel driver (803)"),
    Thread(
        "tensorflow/tensorflow#31319", "`CUDA driver version is insufficient for CUDA "
        "runtime version`",
        "NVML reports driver 470.57.02 (CUDA 11.4); libcuda.so.1 reports CUDA 11.4",
        "driver.version", "error", ("too old for CUDA 12.5",), FIX_DRIVER_UPGRADE,
        Scenario(nvml={"driver_version": "470.57.02", "cuda_driver_version": 11040},
                 libcuda={"init_code": 0, "driver_version": 11040}),
        "The driver is older than TensorFlow's CUDA"),
    Thread(
        "tensorflow/tensorflow#48558", "`CUDA runtime implicit initialization on GPU:0 "
        "failed. Status: all CUDA-capable devices are busy or unavailable`",
        "NVML: exclusive-process compute mode with one process already on the GPU",
        "gpu.0", "error", ("exclusive-process",), FIX_BUSY,
        Scenario(gpus=(("Tesla T4", (7, 5)),), gpu={"compute_mode": 3, "processes": 1}),
        "All CUDA-capable devices are busy or unavailable"),
    Thread(
        "tensorflow/tensorflow#526", "GPUs in EXCLUSIVE_THREAD compute mode: TensorFlow "
        "cannot create its contexts; `nvidia-smi --compute-mode=0` fixed it",
        "NVML: a Tesla P100 in exclusive-thread compute mode",
        "gpu.0", "error", ("exclusive-thread",), FIX_EXCLUSIVE_THREAD,
        Scenario(gpus=(("Tesla P100-PCIE-16GB", (6, 0)),), gpu={"compute_mode": 1})),
    # ------------------------------------------------------------ the GPU and the wheel
    Thread(
        "tensorflow/tensorflow#44191", "mixed_float16 makes training 2-4 times slower on a "
        "GeForce GTX 1660 Ti", "NVML: one NVIDIA GeForce GTX 1660 Ti (7.5, Turing); "
        "MIXED_PRECISION=1", "gpu.mixed_precision", "warn", ("no tensor cores",),
        FIX_FP16_SLOW,
        Scenario(gpus=(("NVIDIA GeForce GTX 1660 Ti", (7, 5)),),
                 settings={"MIXED_PRECISION": "1"}),
        "Mixed precision is slower on a GTX 16xx"),
    Thread(
        "tensorflow/tensorflow#97387", "`TensorFlow was not built with CUDA kernel binaries "
        "compatible with compute capability 12.0`, then CUDA_ERROR_INVALID_HANDLE",
        "NVML: one NVIDIA GeForce RTX 5090 (12.0, Blackwell)", "gpu.0", "error",
        ("Blackwell", "CUDA_ERROR_INVALID_PTX"), FIX_BLACKWELL,
        Scenario(gpus=(("NVIDIA GeForce RTX 5090", (12, 0)),)),
        "Blackwell GPUs (RTX 50xx, B200): CUDA_ERROR_INVALID_PTX"),
    Thread(
        "tensorflow/tensorflow#99592", "RTX 5000 series: `cuModuleLoadData failed with "
        "CUDA_ERROR_INVALID_PTX`; only NVIDIA's NGC container works",
        "NVML: two NVIDIA GeForce RTX 5080 (12.0)", "gpu.0", "error", ("Blackwell",),
        FIX_BLACKWELL, Scenario(gpus=(("NVIDIA GeForce RTX 5080", (12, 0)),) * 2)),
    Thread(
        "tensorflow/tensorflow#89272", "TensorFlow does not work on an RTX 5090 (WSL2)",
        "NVML: one NVIDIA GeForce RTX 5090 under WSL2 (/dev/dxg)", "gpu.0", "error",
        ("Blackwell",), FIX_BLACKWELL,
        Scenario(gpus=(("NVIDIA GeForce RTX 5090", (12, 0)),),
                 host={"in_container": False, "wsl_gpu": True, "device_files": ()})),
    Thread(
        "tensorflow/tensorflow#111958", "XLA on Blackwell: `LLVM ERROR: PTX version 8.5 does "
        "not support target 'sm_120'`", "NVML: one NVIDIA GeForce RTX 5060 Ti (12.0); XLA=1",
        "gpu.0", "error", ("Blackwell",), FIX_BLACKWELL,
        Scenario(gpus=(("NVIDIA GeForce RTX 5060 Ti", (12, 0)),), settings={"XLA": "1"})),
    # ------------------------------------------------------------------ XLA's GPU tools
    Thread(
        "keras-team/keras#17422", "The new optimizers fail with `libdevice not found at "
        "./libdevice.10.bc` although XLA was never asked for",
        "KERAS=2 (tf_keras's optimizers), no nvvm/libdevice where XLA looks", "cuda.libdevice",
        "warn", ("tf_keras", "keras-team/keras#17422"), FIX_NVCC,
        Scenario(site={"libdevice": False}, settings={"KERAS": "2"}),
        "libdevice not found at ./libdevice.10.bc"),
    Thread(
        "tensorflow/tensorflow#58681", "`Can't find libdevice directory "
        "${CUDA_DIR}/nvvm/libdevice` at model.fit (tf_keras's optimizer)",
        "KERAS=2, neither ptxas nor libdevice installed", "cuda.libdevice", "warn",
        ("tf_keras",), FIX_NVCC,
        Scenario(site={"nvcc": False}, settings={"KERAS": "2"})),
    Thread(
        "tensorflow/tensorflow#60790", "`libdevice not found at ./libdevice.10.bc` with XLA",
        "XLA=1, no nvvm/libdevice where XLA looks", "cuda.libdevice", "warn",
        ("XLA=1",), FIX_NVCC, Scenario(site={"libdevice": False}, settings={"XLA": "1"})),
    # ---------------------------------------------------------- the CUDA libraries
    Thread(
        "tensorflow/tensorflow#63362", "`pip install tensorflow[and-cuda]` 2.16: "
        "`tf.config.list_physical_devices('GPU')` is empty, every wheel installed",
        "the stand-in TensorFlow's libtensorflow_framework.so.2 built without RUNPATH; the "
        "wheels there", "cuda.loaded", "error", ("RUNPATH", "tensorflow#63362"), FIX_RUNPATH,
        Scenario(site={"runpath": False}),
        "TensorFlow lists no GPU although the NVIDIA wheels are installed"),
    Thread(
        "tensorflow/tensorflow#60646", "`Cannot dlopen some GPU libraries. ... Skipping "
        "registering GPU devices...`", "no NVIDIA wheel installed (plain `pip install "
        "tensorflow`)", "cuda.libraries", "error", ("none installed",), FIX_AND_CUDA,
        Scenario(site={"missing": "all"}), "Cannot dlopen some GPU libraries"),
    Thread(
        "tensorflow/tensorflow#34287", "`Cannot dlopen some GPU libraries` (cuDNN not found)",
        "every wheel but nvidia-cudnn-cu12", "tensorflow.cudnn", "error",
        ("no cuDNN library found",), FIX_CUDNN, Scenario(site={"missing": ("cudnn",)})),
    Thread(
        "NVIDIA/tensorflow#110", "`Could not load dynamic library 'libcusolver.so.11'; "
        "dlerror: libnvJitLink.so.12: cannot open shared object file`",
        "every wheel but nvidia-nvjitlink-cu12 (cuSOLVER and cuSPARSE need it)",
        "cuda.libraries", "error", ("libnvJitLink.so.12",), FIX_AND_CUDA,
        Scenario(site={"missing": ("nvjitlink",)})),
    Thread(
        "infiniflow/ragflow#4466", "`libcusparse.so.12: undefined symbol: "
        "__nvJitLinkAddData_12_1` with LD_LIBRARY_PATH=/usr/local/cuda-12.1/lib64",
        "an nvJitLink without 12.5's symbols in usr/local/cuda-12.1/lib64 on LD_LIBRARY_PATH",
        "cuda.libraries", "error", ("undefined symbol", "LD_LIBRARY_PATH entry"),
        FIX_SHADOW.replace("FOLDER", "usr/local/cuda-12.1/lib64"),
        Scenario(ld_path={"usr/local/cuda-12.1/lib64": {"nvjitlink-12.1": 0}}),
        "undefined symbol: __nvJitLinkAddData_12_x"),
    Thread(
        "tensorflow/tensorflow#60913", "`Loaded runtime CuDNN library: 9.1.0 but source was "
        "compiled with: 9.3.0`", "another virtual environment's nvidia-cudnn 9.1 on "
        "LD_LIBRARY_PATH", "tensorflow.cudnn", "error", ("9.1.0", "another Python package"),
        FIX_SHADOW.replace("FOLDER", "venv-torch/lib/python3.12/site-packages/nvidia/cudnn/lib"),
        Scenario(ld_path={"venv-torch/lib/python3.12/site-packages/nvidia/cudnn/lib":
                          {"cudnn": 90100}}),
        "Loaded runtime CuDNN library: 9.x but source was compiled with: 9.3.0"),
    # ------------------------------------------------------------------------ Docker
    Thread(
        "NVIDIA/nvidia-docker#1352", "`docker: Error response from daemon: could not select "
        "device driver \"\" with capabilities: [[gpu]]`",
        "on the host, COMPOSE_FILE selects docker-compose.gpu.yml; `docker info` lists runc "
        "only, no CDI spec", "host.docker", "error", ("could not select device driver",),
        FIX_TOOLKIT,
        Scenario(gpus=(A100,), libcuda={"init_code": 0}, host=HOST,
                 docker={"runtimes": ("io.containerd.runc.v2", "runc")}, environ=GPU_COMPOSE),
        "could not select device driver \"\" with capabilities: [[gpu]]"),
    Thread(
        "NVIDIA/nvidia-docker#1642", "`could not select device driver with capabilities: "
        "[[gpu]]` with Docker installed as a snap", "as #1352, the docker command in /snap",
        "host.docker", "error", ("could not select device driver",), FIX_SNAP,
        Scenario(gpus=(A100,), host=HOST, environ=GPU_COMPOSE,
                 docker={"runtimes": ("runc",), "docker": "/snap/docker/2915/bin/docker"})),
    Thread(
        "NVIDIA/nvidia-container-toolkit#48", "`Failed to initialize NVML: Unknown Error` in "
        "a running container after `systemctl daemon-reload`",
        "in a container with its /dev/nvidia* files; NVML's init fails with Unknown Error",
        "driver.nvml", "warn", ("daemon-reload",), FIX_NVML_LOST,
        Scenario(nvml={"init_error": NVML_UNKNOWN}, libcuda=None, site=None,
                 host={"in_container": True}),
        "Failed to initialize NVML: Unknown Error (in a container)"),
    Thread(
        "NVIDIA/nvidia-container-toolkit#251", "`Failed to initialize NVML: Unknown Error` "
        "after calling `systemctl daemon-reload`", "as #48, with GPUS=0",
        "driver.nvml", "error", ("daemon-reload",), FIX_NVML_LOST,
        Scenario(nvml={"init_error": NVML_UNKNOWN}, libcuda=None, site=None,
                 host={"in_container": True}, settings={"GPUS": "0"})),
    Thread(
        "NVIDIA/nccl#342", "`NCCL WARN Call to posix_fallocate failed: No space left on "
        "device` in Docker (64 MB /dev/shm)", "a container with a 64 MiB /dev/shm",
        "container.shm", "warn", ("64 MiB",), FIX_SHM,
        Scenario(host={"in_container": True, "shm_bytes": 64 * 1024 * 1024}),
        "NCCL: posix_fallocate failed / unhandled system error in Docker"),
    Thread(
        "NVIDIA/nccl#290", "`include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No "
        "space left on device` in an NGC container", "as nccl#342, /dev/shm of 64 MiB",
        "container.shm", "warn", ("64 MiB",), FIX_SHM,
        Scenario(gpus=(A100,) * 4, host={"in_container": True, "shm_bytes": 64 * 1024 * 1024})),
    # ------------------------------------------------------------------------------ P2P
    Thread(
        "tensorflow/tensorflow#44976", "`tf.distribute.MirroredStrategy` is stuck; turning "
        "the IOMMU off fixed it", "NVML: PCIe P2P between 2 GPUs; 40 IOMMU groups, "
        "intel_iommu=on", "host.p2p", "warn", ("IOMMU",), FIX_P2P,
        Scenario(nvml=PCIE, p2p={"iommu_groups": 40, "cmdline": "intel_iommu=on"}),
        "MirroredStrategy or NCCL hangs with PCIe P2P (IOMMU, ACS, VMs)"),
    Thread(
        "NVIDIA/nccl#257", "AllReduce hangs; booting with `intel_iommu=off` fixed it",
        "NVML: PCIe P2P between 4 GPUs; IOMMU groups, no IOMMU option on the command line",
        "host.p2p", "warn", ("IOMMU",), FIX_P2P,
        Scenario(gpus=(("GeForce GTX 1080 Ti", (6, 1)),) * 4, nvml=PCIE,
                 p2p={"iommu_groups": 60})),
    Thread(
        "NVIDIA/nccl#631", "Training freezes with 4 GPUs; NCCL_P2P_DISABLE=1 makes it run "
        "(ACS on)", "NVML: PCIe P2P between 4 GPUs; ACS redirecting on their bridge",
        "host.p2p", "warn", ("ACS",), FIX_P2P,
        Scenario(gpus=(A100,) * 4, nvml=PCIE, p2p={"acs": ("0000:00:01.0",)})),
    Thread(
        "NVIDIA/nccl#2079", "ncclAllReduce deadlocks on 2x RTX 5880 Ada (PHB, no NVLink); "
        "disabling ACS on the AMD root bridges (`pci=noacs`) fixed it",
        "NVML: PCIe P2P through the host bridge; ACS on two bridges", "host.p2p", "warn",
        ("ACS",), FIX_P2P,
        Scenario(gpus=(("NVIDIA RTX 5880 Ada Generation", (8, 9)),) * 2,
                 nvml={**PCIE, "topology_level": 30},
                 p2p={"acs": ("0000:00:03.1", "0000:20:01.1")})),
    Thread(
        "tensorflow/tensorflow#57893", "NaN losses with MirroredStrategy on RTX A5000s; "
        "disabling ACS in the BIOS fixed it", "NVML: PCIe P2P between 4 GPUs; ACS on",
        "host.p2p", "warn", ("ACS",), FIX_P2P,
        Scenario(gpus=(("NVIDIA RTX A5000", (8, 6)),) * 4, nvml=PCIE,
                 p2p={"acs": ("0000:40:01.1",)})),
    # ------------------------------------- NVML told apart by the machine's facts (issue 33)
    Thread(
        "Oneflow-Inc/oneflow#3106", "`Failed to initialize NVML: Driver/library version "
        "mismatch` after a driver update; a reboot fixed it",
        "NVML returns 18 (LIB_RM_VERSION_MISMATCH); /proc/driver/nvidia/version says "
        "550.54.15, the libnvidia-ml.so mapped is 550.90.07; a host with 2 GPUs on the bus",
        "driver.nvml", "error", ("kernel module is 550.54.15", "550.90.07",
                                 "without a reboot"), FIX_NVML_MISMATCH,
        Scenario(nvml={"init_error": 18}, libcuda={"init_code": 803}, site=None, tf_gpus=0,
                 host=HOST,
                 machine={"kernel": "550.54.15", "library": "550.90.07"}),
        "Failed to initialize NVML: Driver/library version mismatch"),
    Thread(
        "NVIDIA/nvidia-container-toolkit#210", "`Failed to initialize NVML: Insufficient "
        "Permissions` as a non-root user; the device files were root:video 0660",
        "NVML returns 4 (NO_PERMISSION); /dev/nvidia* are 0660 group video (gid 44), the "
        "user (uid 1000) is not in it; cuInit returns 100",
        "driver.nvml", "error", ("this user cannot open",
                                 "/dev/nvidiactl (-rw-rw---- group video)"),
        FIX_DEVICE_GROUP,
        Scenario(nvml={"init_error": 4}, libcuda={"init_code": 100}, site=None, tf_gpus=0,
                 host=HOST,
                 machine={"device_mode": 0o660, "device_gid": 44}),
        "Failed to initialize NVML: Insufficient Permissions"),
    Thread(
        "JosephKJ/OWOD#81", "Training on 4 GPUs fails; `nvidia-smi`: `Unable to determine "
        "the device handle for GPU 0000:02:00.0: GPU is lost`",
        "4 GPUs on the bus; NVML's handle for GPU 2 returns 15 (GPU_IS_LOST)",
        "driver.nvml", "error", ("GPU 2 (0000:86:00.0)", "NVML_ERROR_GPU_IS_LOST"),
        FIX_GPU_LOST,
        Scenario(gpus=(A100,) * 4, nvml={"handle_errors": {2: 15}}, site=None, tf_gpus=3,
                 machine={"gpus": ("0000:18:00.0", "0000:3b:00.0", "0000:86:00.0",
                                   "0000:af:00.0")}),
        "One GPU fell off the bus (GPU is lost)"),
    # ------------------------------------------------ the container's view, NCCL, TensorFlow
    Thread(
        "mudler/LocalAI#11973", "`nvidia-smi` works in the container, every CUDA backend "
        "fails: `libcuda.so.1: cannot open shared object file` (capabilities gpu, utility)",
        "in a container with the GPUs and NVML, NVIDIA_DRIVER_CAPABILITIES=utility, no "
        "libcuda.so.1 anywhere",
        "driver.cuda_init", "error", ("NVML works in this container",
                                      "NVIDIA_DRIVER_CAPABILITIES=utility"), FIX_CAPABILITIES,
        Scenario(libcuda=None, site=None, tf_gpus=0,
                 environ={"NVIDIA_DRIVER_CAPABILITIES": "utility"}),
        "nvidia-smi works in the container, CUDA does not (driver capabilities)"),
    Thread(
        "NVIDIA/nccl#1837", "NCCL fails at the first all-reduce when NCCL_SOCKET_IFNAME names "
        "an interface that does not exist",
        "NCCL_SOCKET_IFNAME=eth2 on a machine with eno1, lo and docker0",
        "nccl.variables.NCCL_SOCKET_IFNAME", "error", ("NCCL_SOCKET_IFNAME='eth2'",
                                                       "matches none"), FIX_SOCKET_IFNAME,
        Scenario(site=None, environ={"NCCL_SOCKET_IFNAME": "eth2"},
                 machine={"interfaces": ("docker0", "eno1", "lo")}),
        "NCCL_SOCKET_IFNAME names no interface of this machine"),
    Thread(
        "tensorflow/tensorflow#23385", "`Ignoring visible gpu device (... GeForce GTX 1070 "
        "...) with Cuda compute capability 6.1. The minimum required Cuda capability is 7.0`",
        "TensorFlow lists 1 of 2 GPUs and logs its `Ignoring visible gpu device` line",
        "visible.tensorflow", "error", ("TensorFlow ignores GPU 0", "compute capability 6.1"),
        FIX_TF_IGNORES,
        Scenario(gpus=(("NVIDIA GeForce GTX 1070", (6, 1)), A100), site=None, tf_gpus=1,
                 tf_log=("2026-01-01 10:00:01.000002: I tensorflow/core/common_runtime/gpu/"
                         "gpu_device.cc:2344] Ignoring visible gpu device (device: 0, name: "
                         "NVIDIA GeForce GTX 1070, pci bus id: 0000:10:00.0, compute "
                         "capability: 6.1) with Cuda compute capability 6.1. The minimum "
                         "required Cuda capability is 7.0.",)),
        "TensorFlow ignores a GPU (its own reason kept)"),
)
