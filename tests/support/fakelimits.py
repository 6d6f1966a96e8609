"""A machine's limits laid out as files under a root that MGPU_HOST_ROOT points at: the
process's /proc/self/limits, status, uid_map, cgroup and mounts, the cgroup tree (v2, v1 or
none), the kernel's thread limits, /proc/meminfo and /dev/shm. `hardware.limits.collect` and
`hardware.dockerhost.collect` read it exactly as they read the real machine.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mgpu_env.hardware import limits as machine_limits
from mgpu_env.hardware.hostroot import ENV_VAR

MIB = 1024 * 1024
GIB = 1024 * MIB
UNLIMITED = None
# Soft, hard (None: unlimited): a healthy container started as NVIDIA documents.
HEALTHY_RLIMITS: dict[str, tuple[int | None, int | None]] = {
    "nproc": (None, None), "nofile": (1048576, 1048576), "memlock": (None, None),
    "stack": (64 * MIB, None), "as": (None, None), "data": (None, None),
}
ROWS = {v: k for k, v in machine_limits.LIMIT_ROWS.items()}
UNITS = {"nproc": "processes", "nofile": "files"}


def _word(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def limits_text(rlimits: Mapping[str, tuple[int | None, int | None]]) -> str:
    """/proc/self/limits as the kernel writes it (its other rows included)."""
    lines = [f"{'Limit':<26}{'Soft Limit':<21}{'Hard Limit':<21}{'Units':<10}",
             f"{'Max cpu time':<26}{'unlimited':<21}{'unlimited':<21}seconds"]
    for name, (soft, hard) in rlimits.items():
        lines.append(f"{ROWS[name]:<26}{_word(soft):<21}{_word(hard):<21}"
                     f"{UNITS.get(name, 'bytes')}")
    lines.append(f"{'Max pending signals':<26}{'63704':<21}{'63704':<21}signals")
    return "\n".join(lines) + "\n"


def _write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _cgroup_v2(root: Path, path: str, files: Mapping[str, str]) -> None:
    _write(root, "/proc/self/cgroup", f"0::{path}\n")
    _write(root, "/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    for name, value in files.items():
        _write(root, f"/sys/fs/cgroup{path.rstrip('/')}/{name}", value + "\n")


def _cgroup_v1(root: Path, path: str, files: Mapping[str, str]) -> None:
    _write(root, "/proc/self/cgroup",
           f"12:pids:{path}\n11:memory:{path}\n4:cpu,cpuacct:{path}\n3:cpuset:{path}\n"
           "1:name=systemd:/init.scope\n0::/\n")
    for name, value in files.items():
        controller = name.split(".")[0]
        folder = {"cpu": "cpu,cpuacct"}.get(controller, controller)
        _write(root, f"/sys/fs/cgroup/{folder}{path.rstrip('/')}/{name}", value + "\n")


def lay_out(
    root: Path, *,
    rlimits: Mapping[str, tuple[int | None, int | None]] | None = None,
    uid: int = 1000, capabilities: int = 0, user_threads: int = 40,
    cgroup: str = "v2", cgroup_path: str = "/", cgroup_files: Mapping[str, str] | None = None,
    cpus: str = "0-7", threads_max: int = 1_000_000, pid_max: int = 4_194_304,
    threads_now: int = 500, mem_total: int = 64 * GIB, mem_available: int = 60 * GIB,
    shm_size: int | None = 8 * GIB, shm_used: int = 0,
) -> Path:
    """The limits of a machine under `root`; every argument one fact, healthy by default.
    `cgroup`: "v2", "v1" or "none"; `cgroup_files`: the limit files of the process's cgroup
    (`{"pids.max": "512", "pids.current": "40"}`); `shm_size` None: no /dev/shm."""
    table = dict(HEALTHY_RLIMITS, **(rlimits or {}))
    _write(root, "/proc/self/limits", limits_text(table))
    status = (f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nThreads:\t4\n"
              f"Cpus_allowed_list:\t{cpus}\nCapEff:\t{capabilities:016x}\n")
    _write(root, "/proc/self/status", status)
    _write(root, "/proc/self/uid_map", "         0          0 4294967295\n")
    # The process itself as /proc lists it (self is a link there), holding the user's threads.
    _write(root, "/proc/4242/status", f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                      f"Threads:\t{user_threads}\n")
    _write(root, "/proc/1/status", "Name:\tinit\nUid:\t0\t0\t0\t0\nThreads:\t1\n")
    if cgroup == "v2":
        _cgroup_v2(root, cgroup_path, cgroup_files or {})
    elif cgroup == "v1":
        _cgroup_v1(root, cgroup_path, cgroup_files or {})
    else:
        _write(root, "/proc/self/cgroup", "")
    _write(root, "/proc/sys/kernel/threads-max", f"{threads_max}\n")
    _write(root, "/proc/sys/kernel/pid_max", f"{pid_max}\n")
    _write(root, "/proc/loadavg", f"0.10 0.20 0.30 2/{threads_now} 4243\n")
    _write(root, "/proc/meminfo", f"MemTotal:       {mem_total // 1024} kB\n"
                                  f"MemFree:        {mem_available // 2048} kB\n"
                                  f"MemAvailable:   {mem_available // 1024} kB\n")
    mounts = "overlay / overlay rw,relatime 0 0\n"
    if shm_size is not None:
        (root / "dev" / "shm").mkdir(parents=True, exist_ok=True)
        mounts += f"shm /dev/shm tmpfs rw,nosuid,nodev,size={shm_size // 1024}k 0 0\n"
        if shm_used:
            (root / "dev" / "shm" / "held").write_bytes(os.urandom(1024) * (shm_used // 1024))
    _write(root, "/proc/self/mounts", mounts)
    return root


@contextmanager
def host_root(root: Path) -> Iterator[Path]:
    """MGPU_HOST_ROOT set to `root` for the probes run inside."""
    saved = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = str(root)
    try:
        yield root
    finally:
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved


@functools.cache
def healthy_limits(shm_size: int = 8 * GIB) -> machine_limits.MachineLimits:
    """The limits of a healthy machine (every default of `lay_out`, /dev/shm of `shm_size`),
    probed once per size."""
    return probed_limits(shm_size=shm_size)


def probed_limits(root: Path | None = None, **facts: Any) -> machine_limits.MachineLimits:
    """`hardware.limits.collect()` on a machine laid out with `facts` (in `root`, or a new
    temporary folder)."""
    folder = root
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="limits-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    lay_out(folder, **facts)
    with host_root(folder):
        return machine_limits.collect()
