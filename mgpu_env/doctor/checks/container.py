"""The checks of the machine or container around the GPUs.

The machine or container around the GPUs: device files, the user, whether the run folder can be
written. Its limits (/dev/shm, memlock, stack, threads, memory) are judged by `limits` and
`gpulimits` against what TensorFlow will ask for."""

from __future__ import annotations

import re

from mgpu_env.doctor.checks.common import (
    FIX_DRIVER_IN_CONTAINER,
    SAME_CAUSE_AS_NVML,
    Check,
    CheckId,
    Skipped,
    Status,
    check,
    no_gpu,
    wants_gpus,
)
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import cudaerrors

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
DRIVER_DEVICE_FILES = CheckId("driver.device_files")
CONTAINER_USER = CheckId("container.user")
CONTAINER_RUN_FOLDER = CheckId("container.run_folder")


@check(50, DRIVER_DEVICE_FILES)
def check_device_files(facts: Facts) -> Check:
    title = "GPU device files"
    host = facts.host
    expected = (
        "/dev/nvidiactl and /dev/nvidia<N> (added by the NVIDIA Container Toolkit), "
        "or /dev/dxg under WSL2"
    )
    if not host.in_container.ok or not host.in_container.value:
        found = "not in a container" if host.in_container.ok else host.in_container.text()
        return DRIVER_DEVICE_FILES(title, "skip", found, expected,
                                   skipped_for=Skipped("container", "not in a container"))
    if host.wsl_gpu.ok and host.wsl_gpu.value:
        # WSL2 gives containers the GPU through /dev/dxg and the driver libraries in
        # /usr/lib/wsl/lib; there are no /dev/nvidia* files there, and none are needed.
        return DRIVER_DEVICE_FILES(title, "ok",
                                   "WSL2: /dev/dxg (the GPU through the WSL driver)", expected)
    files = host.device_files
    if not files.ok:
        return DRIVER_DEVICE_FILES(title, "warn", files.text(), expected)
    names = files.value or ()
    has_gpu_file = any(re.fullmatch(r"nvidia\d+", n) for n in names)
    found = ", ".join(f"/dev/{n}" for n in names) or "no /dev/nvidia* files"
    if "nvidiactl" in names and has_gpu_file:
        if "nvidia-uvm" not in names and wants_gpus(facts):
            # NVML answers without it, CUDA does not start (cuInit: CUDA_ERROR_UNKNOWN).
            return DRIVER_DEVICE_FILES(title, "warn", found + "; no /dev/nvidia-uvm",
                                       expected + ", and /dev/nvidia-uvm (CUDA needs it)",
                                       cudaerrors.FIX_UVM_CONTAINER)
        return DRIVER_DEVICE_FILES(title, "ok", found, expected)
    if not wants_gpus(facts):
        return DRIVER_DEVICE_FILES(title, "skip", found, "not needed with GPUS=none",
                                   skipped_for=no_gpu(facts))
    status: Status = "warn" if facts.request.kind == "all" else "error"
    if status == "warn" and not facts.nvml.listing.available:
        # One cause, one warning: the driver line already says the container has no GPUs.
        return DRIVER_DEVICE_FILES(title, "skip", found + SAME_CAUSE_AS_NVML,
                                   expected, skipped_for=no_gpu(facts))
    return DRIVER_DEVICE_FILES(title, status, found, expected, FIX_DRIVER_IN_CONTAINER)


@check(290, CONTAINER_USER)
def check_user(facts: Facts) -> Check:
    title = "User"
    expected = "a non-root user"
    euid = facts.host.euid
    if not euid.ok or euid.value is None:
        return CONTAINER_USER(title, "warn", euid.text(), expected)
    if euid.value != 0:
        return CONTAINER_USER(title, "ok", f"uid {euid.value}", expected)
    in_container = bool(facts.host.in_container.value)
    fix = (
        "files written to mounted folders (runs/) will belong to root: compose "
        '`HOST_UID=$(id -u) HOST_GID=$(id -g) docker compose run ...` (the `make docker-*` '
        'targets set them), or drop `--user root`'
        if in_container else "training needs no root: run as your own user"
    )
    return CONTAINER_USER(title, "warn", "root (uid 0)", expected, fix)


@check(300, CONTAINER_RUN_FOLDER)
def check_run_folder(facts: Facts) -> Check:
    title = "Run folder"
    expected = "writable by this user (checkpoints, logs, model.keras, metrics.json)"
    access = facts.run_folder
    if access is None:
        return CONTAINER_RUN_FOLDER(title, "skip", "not checked", expected)
    problem = access.problem()
    if problem is None:
        found = f"{access.path} writable (uid {access.process_uid})"
        return CONTAINER_RUN_FOLDER(title, "ok", found, expected)
    return CONTAINER_RUN_FOLDER(title, "error", problem, expected, access.fix())
