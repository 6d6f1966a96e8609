"""The checks: pure functions from `Facts` to `Check`s (ok / warn / error / skip), by topic.

Each check says what it found, what it expected and, when something is wrong, the fix.
`skip` means the check does not apply here (no GPU to look at, TensorFlow not probed);
it never changes the exit code.

- `driver`: NVML, the driver version and the CUDA it supports;
- `cuda`: TensorFlow's build, the CUDA libraries, cuDNN, NCCL, ptxas and libdevice;
- `gpus`: each GPU, mixed precision, sameness, links;
- `visible`: GPUS, the visibility variables, what TensorFlow lists;
- `container`: device files, the user, the run folder;
- `limits` (`processlimits`, `gpulimits`): every limit that stops TensorFlow (threads,
  memory, address space, open files, /dev/shm, memlock, stack) against what this machine
  makes it ask for (`doctor.demand`);
- `dockerhost`: Docker's host side (daemon, NVIDIA toolkit settings, CDI), on a host;
- `host`: what can break P2P between GPUs;
- `cluster`: the engine that described the cluster, and whether each peer answers;
- `versions`: Python, TensorFlow, Keras against the table and the lock;
- `common`: `Check`, `Status` and the helpers the topics share;
- `judge`: `ALL_CHECKS` in report order and `run_checks`.

A check is a function of `Facts` decorated with `@check(order, preflight=...)`
(`common`) in its topic module: that is the one place it is added.
"""

from __future__ import annotations

from mgpu_env.doctor.checks.cluster import check_cluster
from mgpu_env.doctor.checks.common import (
    FIX_DRIVER_IN_CONTAINER,
    FIX_DRIVER_ON_HOST,
    MIB,
    NCCL_HINTS,
    TF_NOT_PROBED,
    TF_SKIPPED,
    Check,
    CheckFunction,
    Skipped,
    SkippedGroup,
    Status,
    expected_tf_gpus,
    group_skipped,
    target_build,
)
from mgpu_env.doctor.checks.container import check_device_files, check_run_folder, check_user
from mgpu_env.doctor.checks.containerview import check_container_view
from mgpu_env.doctor.checks.cuda import (
    check_cuda_libraries,
    check_cudnn,
    check_libdevice,
    check_nccl,
    check_ptxas,
    check_tf_build,
)
from mgpu_env.doctor.checks.dockerhost import check_docker
from mgpu_env.doctor.checks.driver import (
    check_cuda_driver,
    check_driver_cuda,
    check_driver_version,
    check_nvml,
)
from mgpu_env.doctor.checks.gpulimits import (
    DOCKER_DEFAULT_SHM,
    check_memlock,
    check_shm,
    check_stack,
)
from mgpu_env.doctor.checks.gpus import (
    capability_support,
    check_gpu,
    check_mixed_precision,
    check_topology,
    check_uniform,
    gpu_checks,
)
from mgpu_env.doctor.checks.health import check_health
from mgpu_env.doctor.checks.host import check_p2p
from mgpu_env.doctor.checks.judge import ALL_CHECKS, PREFLIGHT_CHECKS, registered, run_checks
from mgpu_env.doctor.checks.libraries import check_tf_libraries
from mgpu_env.doctor.checks.limits import check_limits
from mgpu_env.doctor.checks.ncclvars import check_nccl_variables
from mgpu_env.doctor.checks.processlimits import (
    check_address_space,
    check_memory,
    check_open_files,
    check_threads,
)
from mgpu_env.doctor.checks.versions import check_keras, check_versions
from mgpu_env.doctor.checks.visible import check_request, check_tf_devices, check_visibility_env

__all__ = [
    "ALL_CHECKS",
    "DOCKER_DEFAULT_SHM",
    "FIX_DRIVER_IN_CONTAINER",
    "FIX_DRIVER_ON_HOST",
    "MIB",
    "NCCL_HINTS",
    "PREFLIGHT_CHECKS",
    "TF_NOT_PROBED",
    "TF_SKIPPED",
    "Check",
    "CheckFunction",
    "Skipped",
    "SkippedGroup",
    "Status",
    "capability_support",
    "check_address_space",
    "check_cluster",
    "check_container_view",
    "check_cuda_driver",
    "check_cuda_libraries",
    "check_cudnn",
    "check_device_files",
    "check_docker",
    "check_driver_cuda",
    "check_driver_version",
    "check_gpu",
    "check_health",
    "check_keras",
    "check_libdevice",
    "check_limits",
    "check_memlock",
    "check_memory",
    "check_mixed_precision",
    "check_nccl",
    "check_nccl_variables",
    "check_nvml",
    "check_open_files",
    "check_p2p",
    "check_ptxas",
    "check_request",
    "check_run_folder",
    "check_shm",
    "check_stack",
    "check_tf_build",
    "check_tf_devices",
    "check_tf_libraries",
    "check_threads",
    "check_topology",
    "check_uniform",
    "check_user",
    "check_versions",
    "check_visibility_env",
    "expected_tf_gpus",
    "gpu_checks",
    "group_skipped",
    "registered",
    "run_checks",
    "target_build",
]
