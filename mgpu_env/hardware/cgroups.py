"""The cgroup limits over this process, v2 (unified) or v1, read as files under the host root.

`/proc/self/cgroup` names the process's cgroup: v2 as one `0::/path` line, v1 as one line per
hierarchy (`4:memory:/docker/abc`, `5:cpu,cpuacct:/...`); a hybrid machine has both, and then
a v1 controller that is mounted wins for its resource (v2's unified tree holds no controller
there). Every ancestor's limit applies as well as the cgroup's own (a pod's, a Slurm job's,
a systemd slice's), so each limit is the smallest along the path, with the usage of the cgroup
that sets it. A container with its own cgroup namespace sees its cgroup as `/`, mounted at
/sys/fs/cgroup; one without sees the host's path, which may not exist in its mount: then the
mount's root is read, and that is said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import Probed, probe

MOUNT = "/sys/fs/cgroup"
# cgroup v1 writes "no limit" as a value near 2**63 (page-aligned): anything this large is none.
V1_UNLIMITED_FROM = 1 << 62


@dataclass(frozen=True)
class Cgroup:
    """The cgroup limits over this process: each the smallest along its path to the root
    (None: no limit), with what is in use in the cgroup that sets it."""

    version: int  # 2, 1, or 0 when the process is in no cgroup hierarchy
    path: str  # as /proc/self/cgroup names it (v1: the memory controller's)
    pids_max: int | None = None
    pids_current: int | None = None
    memory_max: int | None = None
    memory_high: int | None = None  # v2 only: above it the kernel throttles and reclaims
    memory_current: int | None = None
    cpu_quota: float | None = None  # CPUs the CFS quota allows (cpu.max, cfs_quota_us)
    cpuset: int | None = None  # CPUs in cpuset.cpus.effective
    unreadable: tuple[str, ...] = ()  # "file: why", for limit files that exist
    note: str = ""  # e.g. the process's path is not under the mount: its root was read


class _Reader:
    """Reads limit files along a cgroup path, remembering the ones that could not be read."""

    def __init__(self) -> None:
        self.unreadable: list[str] = []

    def text(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return None  # no such controller at this level: no limit here
        except OSError as err:
            self.unreadable.append(f"{path.name}: {err.strerror or err}")
            return None

    def smallest(self, folders: list[Path], limit: str, usage: str,
                 parse: Callable[[str], int | None]) -> tuple[int | None, int | None]:
        """The smallest limit over `folders` (leaf first) and the usage where it is set."""
        best: tuple[int | None, int | None] = (None, None)
        for folder in folders:
            raw = self.text(folder / limit)
            value = parse(raw) if raw else None
            if value is not None and (best[0] is None or value < best[0]):
                used = self.text(folder / usage) if usage else None
                best = (value, int(used) if used and used.isdigit() else None)
        return best


def _v2_value(raw: str) -> int | None:
    return None if raw.split()[0] == "max" else int(raw.split()[0])


def _v1_value(raw: str) -> int | None:
    value = int(raw) if raw.lstrip("-").isdigit() else None
    return None if value is None or value < 0 or value >= V1_UNLIMITED_FROM else value


def _ancestors(mount: Path, path: str) -> tuple[list[Path], str]:
    """The folders from the cgroup up to the mount's root, and a note when the process's
    path is not under the mount (a container without its own cgroup namespace)."""
    leaf = mount / path.lstrip("/")
    if not leaf.is_dir():
        return [mount], f"{path} is not under {MOUNT}: read its root"
    folders = [leaf, *[p for p in leaf.parents if p == mount or mount in p.parents]]
    return folders, ""


def _quota_v2(raw: str | None) -> float | None:
    if not raw or raw.split()[0] == "max":
        return None
    quota, period = raw.split()[:2]
    return int(quota) / int(period)


def cpu_list_count(text: str) -> int:
    """How many CPUs a list such as `0-3,8,10-11` names."""
    count = 0
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            count += int(high or low) - int(low) + 1
    if count <= 0:
        raise ValueError(f"no CPU in the list {text.strip()!r}")
    return count


def _cpuset_count(raw: str | None) -> int | None:
    return cpu_list_count(raw) if raw else None


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """The v2 path (None: none), and for each v1 controller its hierarchy's folder name
    (`cpu,cpuacct`) and its path, from /proc/self/cgroup."""
    unified: str | None = None
    v1: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
        for name in controllers.split(","):
            if name and not name.startswith("name="):
                v1[name] = (controllers, path)
    return unified, v1


def _v2(path: str, reader: _Reader) -> Cgroup:
    mount = host_path(MOUNT)
    folders, note = _ancestors(mount, path)
    pids = reader.smallest(folders, "pids.max", "pids.current", _v2_value)
    memory = reader.smallest(folders, "memory.max", "memory.current", _v2_value)
    high = reader.smallest(folders, "memory.high", "", _v2_value)
    quotas = [q for q in (_quota_v2(reader.text(f / "cpu.max")) for f in folders) if q]
    cpuset = _cpuset_count(reader.text(folders[0] / "cpuset.cpus.effective"))
    return Cgroup(2, path, pids[0], pids[1], memory[0], high[0], memory[1],
                  min(quotas) if quotas else None, cpuset, tuple(reader.unreadable), note)


def _v1_folders(v1: dict[str, tuple[str, str]],
                controller: str) -> tuple[list[Path], str] | None:
    """The folders of a v1 controller's cgroup and its ancestors; None: not mounted."""
    if controller not in v1:
        return None
    hierarchy, path = v1[controller]
    mount = host_path(f"{MOUNT}/{hierarchy}")
    if not mount.is_dir():
        mount = host_path(f"{MOUNT}/{controller}")  # the distribution's link (cpu -> cpu,cpuacct)
    return _ancestors(mount, path) if mount.is_dir() else None


def _v1(v1: dict[str, tuple[str, str]], reader: _Reader) -> Cgroup:
    pids: tuple[int | None, int | None] = (None, None)
    memory: tuple[int | None, int | None] = (None, None)
    notes: list[str] = []
    if (found := _v1_folders(v1, "pids")) is not None:
        pids = reader.smallest(found[0], "pids.max", "pids.current", _v1_value)
    if (found := _v1_folders(v1, "memory")) is not None:
        memory = reader.smallest(found[0], "memory.limit_in_bytes", "memory.usage_in_bytes",
                                 _v1_value)
        notes.append(found[1])
    quota = None
    if (found := _v1_folders(v1, "cpu")) is not None:
        raw_quota = reader.text(found[0][0] / "cpu.cfs_quota_us")
        raw_period = reader.text(found[0][0] / "cpu.cfs_period_us")
        if raw_quota and raw_period and int(raw_quota) > 0:
            quota = int(raw_quota) / int(raw_period)
    cpuset = None
    if (found := _v1_folders(v1, "cpuset")) is not None:
        cpuset = _cpuset_count(reader.text(found[0][0] / "cpuset.effective_cpus"))
    path = v1["memory"][1] if "memory" in v1 else v1["pids"][1]
    return Cgroup(1, path, pids[0], pids[1], memory[0], None,
                  memory[1], quota, cpuset, tuple(reader.unreadable),
                  "; ".join(n for n in notes if n))


def cgroup_limits() -> Probed[Cgroup]:
    """The cgroup limits over this process (version 0: in no hierarchy we can read)."""

    def read() -> Cgroup:
        unified, v1 = parse_proc_cgroup(host_path("/proc/self/cgroup").read_text())
        reader = _Reader()
        # A hybrid machine mounts v1 controllers and an empty unified tree: v1 holds them.
        if any(name in v1 for name in ("memory", "pids")):
            return _v1(v1, reader)
        if unified is not None and host_path(f"{MOUNT}/cgroup.controllers").exists():
            return _v2(unified, reader)
        return Cgroup(0, unified or "")

    return probe(read)
