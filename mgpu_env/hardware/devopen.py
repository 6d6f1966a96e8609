"""The device files CUDA opens, opened for real by this process.

The device files CUDA opens (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<minor>), opened for
real by this process, and the model of every errno such an open can give.

The open is the kernel's own answer: mode bits, the process's groups, a cgroup's device rules,
an LSM, a `nodev` mount and the driver behind the device number all speak through it. The
explanation then reads what sits between the process and the file: its mode and group, the
process's identity (`/proc/self/status`: Uid, Gid, Groups) and the cgroup's device rules
(cgroup v1 `devices.list`; v2 keeps them in an eBPF program nobody can read back).

Under a fake root (MGPU_HOST_ROOT) the test process is root, whom no mode refuses; when the
identity in that root's /proc/self/status is not this process's, the mode is judged for that
identity as the kernel would (`judged=True`), so a fake machine of regular files still says
EACCES where the real one would.
"""

from __future__ import annotations

import errno as errnos
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mgpu_env.hardware.hostroot import host_root

NVIDIA_MAJOR = 195  # nvidiactl is 195:255, nvidia<N> 195:N (nvidia-uvm's major is dynamic)


@dataclass(frozen=True)
class Identity:
    """Who opens: effective uid, gid and supplementary groups (/proc/self/status)."""

    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class DeviceOpen:
    """One open of a device file: errno None when it opened."""

    name: str  # nvidia0
    errno: int | None
    mode: str = ""  # crw-rw-rw- ("" when the file is not there)
    gid: int | None = None
    char_device: bool = False
    judged: bool = False  # EACCES from the mode for the fake root's identity
    mode_allows: bool = True  # the mode lets the identity read and write
    group: str = ""  # the file's group by name (filled by `nvidiahost`, which reads /etc/group)


def identity(root: Path | None = None) -> Identity:
    """The identity /proc/self/status reports (under the host root), else this process's."""
    path = (host_root() if root is None else root) / "proc/self/status"
    try:
        fields = dict(line.split(":", 1) for line in path.read_text().splitlines()
                      if ":" in line)
        uid = int(fields["Uid"].split()[1])
        gid = int(fields["Gid"].split()[1])
        groups = tuple(int(g) for g in fields.get("Groups", "").split())
        return Identity(uid, gid, groups)
    except (OSError, KeyError, ValueError, IndexError):
        return Identity(os.geteuid(), os.getegid(), tuple(os.getgroups()))


def mode_allows(info: os.stat_result, who: Identity) -> bool:
    """Read and write by the mode bits, as the kernel decides it (root passes)."""
    if who.uid == 0:
        return True
    if info.st_uid == who.uid:
        wanted = stat.S_IRUSR | stat.S_IWUSR
    elif info.st_gid in (who.gid, *who.groups):
        wanted = stat.S_IRGRP | stat.S_IWGRP
    else:
        wanted = stat.S_IROTH | stat.S_IWOTH
    return info.st_mode & wanted == wanted


def open_device(name: str, who: Identity, root: Path | None = None) -> DeviceOpen:
    """Open /dev/<name> read-write, as CUDA does, and close it at once."""
    path = (host_root() if root is None else root) / "dev" / name
    try:
        info = path.stat()
    except OSError as err:
        return DeviceOpen(name, err.errno)
    mode, char = stat.filemode(info.st_mode), stat.S_ISCHR(info.st_mode)
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as err:
        return DeviceOpen(name, err.errno, mode, info.st_gid, char,
                          mode_allows=mode_allows(info, who))
    os.close(descriptor)
    if who.uid != os.geteuid() and not mode_allows(info, who):
        return DeviceOpen(name, errnos.EACCES, mode, info.st_gid, char, judged=True,
                          mode_allows=False)
    return DeviceOpen(name, None, mode, info.st_gid, char)


def device_rules(root: Path | None = None) -> tuple[str, ...] | None:
    """cgroup v1 device rules of this process's cgroup ("c 195:* rwm", "a *:* rwm"); None
    where they cannot be read (cgroup v2 keeps them in eBPF)."""
    top = host_root() if root is None else root
    base = top / "sys/fs/cgroup/devices"
    try:
        own = ""
        for line in (top / "proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and "devices" in parts[1].split(","):
                own = parts[2].lstrip("/")
        for folder in (base / own, base):
            if (folder / "devices.list").is_file():
                return tuple((folder / "devices.list").read_text().split("\n")[:-1])
    except OSError:
        return None
    return None


def rules_allow(rules: tuple[str, ...], minor: int, major: int = NVIDIA_MAJOR) -> bool:
    """Whether cgroup v1 rules let a process open c major:minor read-write."""
    for rule in rules:
        parts = rule.split()
        if len(parts) != 3:
            continue
        kind, number, access = parts
        matches = kind == "a" or (kind == "c" and _matches(number, major, minor))
        if matches and "r" in access and "w" in access:
            return True
    return False


def _matches(number: str, major: int, minor: int) -> bool:
    want_major, _, want_minor = number.partition(":")
    return want_major in ("*", str(major)) and want_minor in ("*", str(minor))
