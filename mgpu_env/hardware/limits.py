"""The limits a process meets when TensorFlow starts its thread pools and allocates.

The process's own (`/proc/self/limits`), its cgroup's (v2 and v1), the kernel's, and the
machine's memory, `/dev/shm` and CPUs.

Every file is read through `hostroot.host_path`, so a test lays the machine out as files under
MGPU_HOST_ROOT and the probe reads it as it reads the real one; `resource.getrlimit` and
`os.sched_getaffinity` are not used, because they answer for this process only and a test
could only patch them. Each part is a `Probed`: what cannot be read is "could not collect
(why)", never a guess. The judgement (what TensorFlow will ask for, and whether each limit
holds it) is the doctor's (`doctor/demand.py`, `doctor/checks/limits.py`).

What counts against what (Linux):
- RLIMIT_NPROC counts every thread of the process's real user, in every process; the root of
  the initial user namespace and CAP_SYS_RESOURCE / CAP_SYS_ADMIN are exempt (kernel
  `copy_process`), which is why the user's threads, the uid map and the capabilities are read.
- pids.max (cgroup pids controller) counts every thread in the cgroup and its children, and
  each ancestor's limit applies too: the smallest room left along the path binds.
- threads-max and pid_max bound every thread on the machine (`/proc/loadavg` counts them).
- RLIMIT_AS counts every mapping, thread stacks and CUDA's address reservation included;
  RLIMIT_DATA the private writable ones (since Linux 4.7).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from mgpu_env.hardware.cgroups import Cgroup, cgroup_limits, cpu_list_count
from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import Probed, probe

# /proc/self/limits' rows this module reads, by the short name the doctor uses.
LIMIT_ROWS = {
    "Max processes": "nproc",
    "Max open files": "nofile",
    "Max locked memory": "memlock",
    "Max stack size": "stack",
    "Max address space": "as",
    "Max data size": "data",
}
CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 21, 24


@dataclass(frozen=True)
class Rlimit:
    """One row of /proc/self/limits; None is unlimited."""

    soft: int | None
    hard: int | None


@dataclass(frozen=True)
class Identity:
    """What decides whether RLIMIT_NPROC applies to this process."""

    uid: int
    init_user_namespace: bool  # /proc/self/uid_map maps every uid onto itself
    capabilities: int  # CapEff

    @property
    def nproc_exempt(self) -> bool:
        root = self.uid == 0 and self.init_user_namespace
        return root or bool(self.capabilities & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE))


@dataclass(frozen=True)
class KernelThreads:
    threads_max: int  # /proc/sys/kernel/threads-max
    pid_max: int  # /proc/sys/kernel/pid_max
    threads_now: int  # every thread on the machine (/proc/loadavg's 4th field)


@dataclass(frozen=True)
class MachineLimits:
    """Everything that can stop TensorFlow's threads and allocations on this machine."""

    rlimits: Probed[dict[str, Rlimit]] = field(default_factory=Probed)
    identity: Probed[Identity] = field(default_factory=Probed)
    user_threads: Probed[int] = field(default_factory=Probed)  # of this real uid
    cgroup: Probed[Cgroup] = field(default_factory=Probed)
    kernel: Probed[KernelThreads] = field(default_factory=Probed)
    meminfo: Probed[tuple[int, int]] = field(default_factory=Probed)  # total, available
    shm: Probed[tuple[int, int]] = field(default_factory=Probed)  # /dev/shm size, free
    cpus: Probed[int] = field(default_factory=Probed)  # Cpus_allowed_list


def describe(limits: MachineLimits) -> str:
    """One line of what was read, for a bug report (None: unlimited)."""
    def word(value: int | None) -> str:
        return "unlimited" if value is None else str(value)

    parts = [f"{name} {word(r.soft)}/{word(r.hard)}"
             for name, r in sorted((limits.rlimits.value or {}).items())] or [
        f"rlimits: {limits.rlimits.text()}"]
    cgroup = limits.cgroup.value
    if cgroup is not None and cgroup.version:
        parts.append(f"cgroup v{cgroup.version} {cgroup.path}: pids.max "
                     f"{word(cgroup.pids_max)}, memory.max {word(cgroup.memory_max)}"
                     + (f", CPU quota {cgroup.cpu_quota:g}" if cgroup.cpu_quota else ""))
    if limits.shm.value is not None:
        parts.append(f"/dev/shm {limits.shm.value[0]} bytes ({limits.shm.value[1]} free)")
    if limits.cpus.value is not None:
        parts.append(f"{limits.cpus.value} CPUs allowed")
    return "; ".join(parts)


# --------------------------------------------------------------------------- parsing


def _limit_value(word: str) -> int | None:
    return None if word == "unlimited" else int(word)


def parse_limits(text: str) -> dict[str, Rlimit]:
    """The rows of /proc/self/limits this module reads; a missing row is an error."""
    found: dict[str, Rlimit] = {}
    for line in text.splitlines()[1:]:
        match = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if match and match.group(1) in LIMIT_ROWS:
            found[LIMIT_ROWS[match.group(1)]] = Rlimit(_limit_value(match.group(2)),
                                                       _limit_value(match.group(3)))
    missing = sorted(set(LIMIT_ROWS.values()) - set(found))
    if missing:
        raise ValueError(f"/proc/self/limits has no row for {', '.join(missing)}")
    return found


def status_fields(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


# --------------------------------------------------------------------------- probes


def _read(path: str) -> str:
    return host_path(path).read_text()


def process_limits() -> Probed[dict[str, Rlimit]]:
    return probe(lambda: parse_limits(_read("/proc/self/limits")))


def identity() -> Probed[Identity]:
    def read() -> Identity:
        status = status_fields(_read("/proc/self/status"))
        uid = int(status["Uid"].split()[0])  # real, effective, saved, filesystem
        uid_map = _read("/proc/self/uid_map").split()
        return Identity(uid, uid_map == ["0", "0", "4294967295"], int(status["CapEff"], 16))

    return probe(read)


def allowed_cpus() -> Probed[int]:
    return probe(lambda: cpu_list_count(
        status_fields(_read("/proc/self/status"))["Cpus_allowed_list"]))


def threads_of_user(uid: int) -> int:
    """Threads of every process whose real uid is `uid`: what RLIMIT_NPROC counts."""
    total = 0
    proc = host_path("/proc")
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            fields = status_fields((proc / entry.name / "status").read_text())
        except OSError:  # the process ended while we looked
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def kernel_threads() -> Probed[KernelThreads]:
    def read() -> KernelThreads:
        running_total = _read("/proc/loadavg").split()[3]
        return KernelThreads(int(_read("/proc/sys/kernel/threads-max")),
                             int(_read("/proc/sys/kernel/pid_max")),
                             int(running_total.split("/")[1]))

    return probe(read)


def meminfo() -> Probed[tuple[int, int]]:
    def read() -> tuple[int, int]:
        fields = status_fields(_read("/proc/meminfo"))
        kib = lambda name: int(fields[name].split()[0]) * 1024  # noqa: E731
        return kib("MemTotal"), kib("MemAvailable")

    return probe(read)


def tmpfs_size(mounts: str, mount_point: str) -> int | None:
    """The `size=` of the tmpfs mounted at `mount_point` in /proc/self/mounts (Docker's
    --shm-size writes it, as `size=65536k`); None when it is not given there."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == mount_point:
            for option in fields[3].split(","):
                match = re.fullmatch(r"size=(\d+)([kmg]?)", option)
                if match:
                    scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match.group(2)]
                    return int(match.group(1)) * scale
    return None


def shm_space(path: str = "/dev/shm") -> Probed[tuple[int, int]]:
    """/dev/shm's size and free bytes: the size from its mount options (what --shm-size set),
    the free space as that less its files' blocks; where the mount names no size (a host's
    default tmpfs, or a folder), statvfs answers both."""

    def read() -> tuple[int, int]:
        where = host_path(path)
        if not where.is_dir():
            raise FileNotFoundError(f"no folder {path}")
        size = tmpfs_size(_read("/proc/self/mounts"), path)
        if size is None:
            stats = os.statvfs(where)
            return stats.f_frsize * stats.f_blocks, stats.f_frsize * stats.f_bavail
        used = sum(f.stat().st_blocks * 512 for f in where.rglob("*") if f.is_file())
        return size, max(size - used, 0)

    return probe(read)


def collect() -> MachineLimits:
    """Every limit, read once; about a millisecond, more where RLIMIT_NPROC applies (the
    user's threads are then counted over /proc)."""
    rlimits = process_limits()
    who = identity()
    known = who.value
    nproc = (rlimits.value or {}).get("nproc")
    if known is None:
        users: Probed[int] = Probed(error=who.error)
    elif nproc is None or nproc.soft is None or known.nproc_exempt:
        users = Probed(value=0, error=None)  # not counted: RLIMIT_NPROC does not bind here
    else:
        users = probe(lambda: threads_of_user(known.uid))
    return MachineLimits(rlimits, who, users, cgroup_limits(), kernel_threads(), meminfo(),
                         shm_space(), allowed_cpus())
