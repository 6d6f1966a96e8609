"""The checks in report order, and the runner that turns each into `Check`s.

Apart from `common`, so that the topic modules and the list of them never import each other.
"""

from __future__ import annotations

from collections.abc import Iterable

from mgpu_env.doctor.checks.cluster import check_cluster
from mgpu_env.doctor.checks.common import Check, CheckFunction
from mgpu_env.doctor.checks.container import (
    check_device_files,
    check_memlock,
    check_run_folder,
    check_shm,
    check_stack,
    check_user,
)
from mgpu_env.doctor.checks.cuda import (
    check_cuda_libraries,
    check_cudnn,
    check_libdevice,
    check_nccl,
    check_ptxas,
    check_tf_build,
)
from mgpu_env.doctor.checks.driver import (
    check_cuda_driver,
    check_driver_cuda,
    check_driver_version,
    check_nvml,
)
from mgpu_env.doctor.checks.gpus import (
    check_mixed_precision,
    check_topology,
    check_uniform,
    gpu_checks,
)
from mgpu_env.doctor.checks.host import check_docker, check_p2p
from mgpu_env.doctor.checks.containerview import check_container_view
from mgpu_env.doctor.checks.health import check_health
from mgpu_env.doctor.checks.libraries import check_tf_libraries
from mgpu_env.doctor.checks.ncclvars import check_nccl_variables
from mgpu_env.doctor.checks.versions import check_keras, check_versions
from mgpu_env.doctor.checks.visible import check_request, check_tf_devices, check_visibility_env
from mgpu_env.doctor.facts import Facts

ALL_CHECKS: tuple[CheckFunction, ...] = (
    check_nvml,
    check_driver_version,
    check_driver_cuda,
    check_cuda_driver,
    check_device_files,
    check_container_view,
    check_tf_build,
    check_cuda_libraries,
    check_tf_libraries,
    check_cudnn,
    check_nccl,
    check_nccl_variables,
    check_ptxas,
    check_libdevice,
    check_versions,
    check_keras,
    gpu_checks,
    check_health,
    check_mixed_precision,
    check_uniform,
    check_topology,
    check_p2p,
    check_request,
    check_visibility_env,
    check_tf_devices,
    check_shm,
    check_memlock,
    check_stack,
    check_user,
    check_run_folder,
    check_docker,
    check_cluster,
)


def run_checks(
    facts: Facts, checks: Iterable[CheckFunction] | None = None
) -> list[Check]:
    """Every check (default: `ALL_CHECKS`), in report order. A check that raises becomes a
    warning, not a crash."""
    results: list[Check] = []
    for check in ALL_CHECKS if checks is None else checks:
        try:
            outcome = check(facts)
        except Exception as err:
            name = getattr(check, "__name__", "check")
            results.append(Check(name, name, "warn", f"could not collect ({err!r})"))
            continue
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results
