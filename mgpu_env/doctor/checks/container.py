"""The machine or container around the GPUs: device files, /dev/shm, ulimits, the user,
whether the run folder can be written.

NVIDIA's containers ask for `--ipc=host` (or a large /dev/shm), `--ulimit memlock=-1` and
`--ulimit stack=67108864` (the NGC containers' start-up banner and their user guide).
"""

from __future__ import annotations

import re

from mgpu_env.doctor.checks.common import (
    FIX_DRIVER_IN_CONTAINER,
    MIB,
    SAME_CAUSE_AS_NVML,
    Check,
    Skipped,
    Status,
    check,
    limit_text,
    no_gpu,
    wants_gpus,
)
from mgpu_env.doctor.facts import UNLIMITED, Facts
from mgpu_env.hardware import cudaerrors

DOCKER_DEFAULT_SHM = 64 * MIB
NVIDIA_STACK_BYTES = 64 * MIB


@check(50)
def check_device_files(facts: Facts) -> Check:
    title = "GPU device files"
    host = facts.host
    expected = (
        "/dev/nvidiactl and /dev/nvidia<N> (added by the NVIDIA Container Toolkit), "
        "or /dev/dxg under WSL2"
    )
    if not host.in_container.ok or not host.in_container.value:
        found = "not in a container" if host.in_container.ok else host.in_container.text()
        return Check("driver.device_files", title, "skip", found, expected,
                     skipped_for=Skipped("container", "not in a container"))
    if host.wsl_gpu.ok and host.wsl_gpu.value:
        # WSL2 gives containers the GPU through /dev/dxg and the driver libraries in
        # /usr/lib/wsl/lib; there are no /dev/nvidia* files there, and none are needed.
        return Check("driver.device_files", title, "ok",
                     "WSL2: /dev/dxg (the GPU through the WSL driver)", expected)
    files = host.device_files
    if not files.ok:
        return Check("driver.device_files", title, "warn", files.text(), expected)
    names = files.value or ()
    has_gpu_file = any(re.fullmatch(r"nvidia\d+", n) for n in names)
    found = ", ".join(f"/dev/{n}" for n in names) or "no /dev/nvidia* files"
    if "nvidiactl" in names and has_gpu_file:
        if "nvidia-uvm" not in names and wants_gpus(facts):
            # NVML answers without it, CUDA does not start (cuInit: CUDA_ERROR_UNKNOWN).
            return Check("driver.device_files", title, "warn", found + "; no /dev/nvidia-uvm",
                         expected + ", and /dev/nvidia-uvm (CUDA needs it)",
                         cudaerrors.FIX_UVM_CONTAINER)
        return Check("driver.device_files", title, "ok", found, expected)
    if not wants_gpus(facts):
        return Check("driver.device_files", title, "skip", found, "not needed with GPUS=none",
                     skipped_for=no_gpu(facts))
    status: Status = "warn" if facts.request.kind == "all" else "error"
    if status == "warn" and not facts.nvml.listing.available:
        # One cause, one warning: the driver line already says the container has no GPUs.
        return Check("driver.device_files", title, "skip", found + SAME_CAUSE_AS_NVML,
                     expected, skipped_for=no_gpu(facts))
    return Check("driver.device_files", title, status, found, expected, FIX_DRIVER_IN_CONTAINER)


# ---------------------------------------------------------------------------- limits


@check(260)
def check_shm(facts: Facts) -> Check:
    title = "/dev/shm size"
    expected = "more than Docker's 64 MiB default (1 GiB or more for multi-GPU)"
    shm = facts.host.shm_bytes
    if not shm.ok or shm.value is None:
        return Check("container.shm", title, "warn", shm.text(), expected)
    found = f"{shm.value / MIB:.0f} MiB"
    if shm.value <= DOCKER_DEFAULT_SHM:
        return Check("container.shm", title, "warn", found, expected,
                     "compose: `shm_size: 1gb` (or `ipc: host`) on the service; docker run: "
                     "--shm-size=1g (NCCL and tf.data use shared memory)")
    return Check("container.shm", title, "ok", found, expected)


@check(270)
def check_memlock(facts: Facts) -> Check:
    title = "memlock limit"
    expected = "unlimited (CUDA and NCCL pin host memory)"
    memlock = facts.host.memlock
    if not memlock.ok or memlock.value is None:
        return Check("container.memlock", title, "warn", memlock.text(), expected)
    soft, hard = memlock.value
    found = f"soft {limit_text(soft)}, hard {limit_text(hard)}"
    if soft == UNLIMITED:
        return Check("container.memlock", title, "ok", found, expected)
    if not facts.selected:
        return Check("container.memlock", title, "ok", found + " (no GPU used)", expected)
    return Check("container.memlock", title, "warn", found, expected,
                 "compose: `ulimits: {memlock: -1}`; docker run: --ulimit memlock=-1 "
                 "(outside a container: `ulimit -l unlimited` via /etc/security/limits.conf)")


@check(280)
def check_stack(facts: Facts) -> Check:
    title = "stack limit"
    expected = (
        f"{NVIDIA_STACK_BYTES // MIB} MiB or more, or unlimited (NVIDIA's recommended "
        "`--ulimit stack=67108864`)"
    )
    stack = facts.host.stack
    if not stack.ok or stack.value is None:
        return Check("container.stack", title, "warn", stack.text(), expected)
    soft, hard = stack.value
    found = f"soft {limit_text(soft)}, hard {limit_text(hard)}"
    if soft == UNLIMITED or soft >= NVIDIA_STACK_BYTES:
        return Check("container.stack", title, "ok", found, expected)
    if not facts.selected:
        return Check("container.stack", title, "ok", found + " (no GPU used)", expected)
    return Check("container.stack", title, "warn", found, expected,
                 "compose: `ulimits: {stack: 67108864}`; docker run: --ulimit stack=67108864 "
                 "(bytes); outside a container: `ulimit -s 65536` (KiB) before mgpu")


@check(290)
def check_user(facts: Facts) -> Check:
    title = "User"
    expected = "a non-root user"
    euid = facts.host.euid
    if not euid.ok or euid.value is None:
        return Check("container.user", title, "warn", euid.text(), expected)
    if euid.value != 0:
        return Check("container.user", title, "ok", f"uid {euid.value}", expected)
    in_container = bool(facts.host.in_container.value)
    fix = (
        "files written to mounted folders (runs/) will belong to root: compose "
        '`HOST_UID=$(id -u) HOST_GID=$(id -g) docker compose run ...` (the `make docker-*` '
        'targets set them), or drop `--user root`'
        if in_container else "training needs no root: run as your own user"
    )
    return Check("container.user", title, "warn", "root (uid 0)", expected, fix)


@check(300)
def check_run_folder(facts: Facts) -> Check:
    title = "Run folder"
    expected = "writable by this user (checkpoints, logs, model.keras, metrics.json)"
    access = facts.run_folder
    if access is None:
        return Check("container.run_folder", title, "skip", "not checked", expected)
    problem = access.problem()
    if problem is None:
        found = f"{access.path} writable (uid {access.process_uid})"
        return Check("container.run_folder", title, "ok", found, expected)
    return Check("container.run_folder", title, "error", problem, expected, access.fix())
