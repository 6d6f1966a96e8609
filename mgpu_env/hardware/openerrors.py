"""Every errno an open of an NVIDIA device file can give, with its meaning and fix.

Every errno an open of an NVIDIA device file can give, each with what it means there and the
fix, judged from what sits between the process and the file (`OpenContext`).

open(2) documents EACCES, EBADF, EBUSY, EDQUOT, EEXIST, EFAULT, EFBIG, EINTR, EINVAL, EISDIR,
ELOOP, EMFILE, ENAMETOOLONG, ENFILE, ENODEV, ENOENT, ENOMEM, ENOSPC, ENOTDIR, ENXIO,
EOPNOTSUPP, EOVERFLOW, EPERM, EROFS, ETXTBSY and EWOULDBLOCK; a driver's open may also answer
EIO, EAGAIN or anything else. `explain` covers each one: the documented ones by name, the
flags-only ones (O_CREAT, O_EXCL, O_TMPFILE, a dirfd: none of them used here) as "cannot come
from this open", any other number as the driver's own answer, never as nothing.
"""

from __future__ import annotations

import errno as e
import os
from dataclasses import dataclass

from mgpu_env.hardware.cudaerrors import FIX_UVM, FIX_UVM_CONTAINER


@dataclass(frozen=True)
class OpenContext:
    """What tells the causes of one failed open apart."""

    path: str  # /dev/nvidia2
    mode: str = ""  # crw-rw---- ("" when missing)
    group: str = ""  # the file's group, by name
    uid: int = 0
    groups: tuple[str, ...] = ()  # the process's groups, by name
    mode_allows: bool = True
    in_container: bool = False
    given_elsewhere: str | None = None  # "NVIDIA_VISIBLE_DEVICES=0,1": not given to this job
    rules: str | None = None  # cgroup v1 device rules that refuse it; None: unknown/allowed
    module_loaded: bool = True


@dataclass(frozen=True)
class OpenCause:
    cause: str
    fix: str
    intended: bool = False  # the job was not given this GPU: no fault


NEVER_HERE = frozenset({e.EBADF, e.EDQUOT, e.EEXIST, e.EFAULT, e.EFBIG, e.EINVAL, e.ENOSPC,
                        e.EOPNOTSUPP, e.EOVERFLOW, e.ETXTBSY})
_NEVER_WHY = ("cannot come from this open (O_RDWR|O_CLOEXEC on an absolute path: no O_CREAT, "
              "O_EXCL, O_TMPFILE or dirfd): the kernel or the driver answered it unexpectedly")


def explain(code: int, c: OpenContext) -> OpenCause:
    """The cause and the fix of `open(c.path)` failing with `code`."""
    name = e.errorcode.get(code, str(code))
    said = f"open({c.path}) failed: {name} ({os.strerror(code)})"
    for handler in (_missing, _refused, _no_driver, _busy, _limits):
        found = handler(code, c, said)
        if found is not None:
            return found
    if code in NEVER_HERE:
        return OpenCause(f"{said}; {_NEVER_WHY}", "report it with `mgpu doctor --report`")
    return OpenCause(
        f"{said}; not an answer open(2) documents: the NVIDIA driver's own",
        "`sudo dmesg | grep -i -e NVRM -e Xid` names what the driver saw")


def _missing(code: int, c: OpenContext, said: str) -> OpenCause | None:
    if code in (e.ENOENT, e.ENOTDIR, e.ENAMETOOLONG, e.ELOOP, e.EISDIR):
        uvm = "nvidia-uvm" in c.path
        if code == e.ENOENT and c.given_elsewhere:
            return OpenCause(f"{c.path} is not here: this job was not given that GPU "
                             f"({c.given_elsewhere})", "", intended=True)
        if code == e.ENOENT and c.in_container:
            return OpenCause(f"{said}: the container was started without it",
                             FIX_UVM_CONTAINER if uvm else
                             "start the container with the GPUs (`--gpus all`, compose "
                             "`gpus: all`); the NVIDIA Container Toolkit adds the files")
        if code == e.ENOENT:
            return OpenCause(f"{said}: nothing created the device file (nvidia-modprobe or "
                             "udev makes it when the module loads)",
                             FIX_UVM if uvm else "`sudo nvidia-modprobe -c 0` (one per GPU "
                             "minor) or `sudo modprobe nvidia`; `nvidia-smi` creates them too")
        if code == e.EISDIR:
            return OpenCause(f"{said}: {c.path} is a folder, as Docker makes a bind mount "
                             "whose source did not exist on the host",
                             "remove the `-v /dev/nvidia...` mounts and start the container "
                             "with `--gpus` (the toolkit adds the real device files)")
        return OpenCause(f"{said}: the path to it is broken (a link loop, or a file where a "
                         "folder should be)", "check /dev and MGPU_HOST_ROOT")
    return None


def _refused(code: int, c: OpenContext, said: str) -> OpenCause | None:
    if code not in (e.EACCES, e.EPERM, e.EROFS):
        return None
    if c.given_elsewhere:
        return OpenCause(f"{said}: the job's cgroup refuses it, and the job was not given this "
                         f"GPU ({c.given_elsewhere})", "", intended=True)
    if code == e.EACCES and not c.mode_allows:
        who = f"uid {c.uid} in groups {', '.join(c.groups) or 'none'}"
        return OpenCause(
            f"{said}: the file is {c.mode} group {c.group or '?'}, and this process runs as "
            f"{who}, which the mode does not let read and write",
            f"add the user to {c.group or 'its group'} (`sudo usermod -aG "
            f"{c.group or 'video'} $USER`, then log in again; in a container `--group-add "
            f"{c.group or 'video'}`), or let the driver make the files 0666 "
            "(`options nvidia NVreg_DeviceFileMode=0666` in /etc/modprobe.d)")
    if c.rules is not None:
        return OpenCause(f"{said}: the mode allows it, but the cgroup's device rules do not "
                         f"({c.rules})", "give the container the GPU (`--gpus`, or "
                         "`--device` for each /dev/nvidia* file), not only a bind mount")
    if c.in_container:
        return OpenCause(
            f"{said}: the mode ({c.mode}) allows it, so the container's device rules refuse "
            "it: the file was mounted without `--gpus`/`--device`, or the host's "
            "`systemctl daemon-reload` dropped the rules of a container running under the "
            "systemd cgroup driver (NVML then says \"Unknown Error\")",
            "restart the container; to keep it from recurring, give the GPUs by CDI "
            "(`nvidia-ctk cdi generate`) or run `sudo nvidia-ctk system "
            "create-dev-char-symlinks --create-all` on the host (NVIDIA's documented fix)")
    return OpenCause(f"{said}: the mode ({c.mode}) allows it, so a security module (SELinux, "
                     "AppArmor), a `nodev` mount or a cgroup's device rules refuse it",
                     "`sudo dmesg | grep -i -e denied -e apparmor`; `findmnt -T /dev` shows "
                     "nodev; a scheduler's job cgroup refuses GPUs it did not allocate")


def _no_driver(code: int, c: OpenContext, said: str) -> OpenCause | None:
    if code not in (e.ENXIO, e.ENODEV):
        return None
    why = ("the nvidia module is not loaded" if not c.module_loaded else
           "the module does not own this device number (a file left from before a driver "
           "reload, or from another machine in a bind mount)")
    return OpenCause(f"{said}: the file is there but no driver answers behind it: {why}",
                     "`sudo modprobe nvidia` (and `nvidia_uvm`); in a container, recreate it "
                     "after the host's driver reloaded")


def _busy(code: int, c: OpenContext, said: str) -> OpenCause | None:
    if code == e.EBUSY:
        return OpenCause(f"{said}: the GPU is held exclusively (a virtual machine, a GPU "
                         "reset or a driver unload in progress)",
                         "`nvidia-smi` shows who holds it; wait for the reset, or stop the VM")
    if code in (e.EAGAIN, e.EINTR):
        return OpenCause(f"{said}: the driver asked to try again (it is still starting up the "
                         "GPU, or a signal came)", "run `mgpu doctor` again; if it stays, "
                         "enable persistence mode (`sudo nvidia-smi -pm 1`)")
    if code == e.EIO:
        return OpenCause(f"{said}: the driver could not talk to the GPU (it may have fallen "
                         "off the bus)", "`sudo dmesg | grep -i xid` (Xid 79: fell off the "
                         "bus); reset it (`sudo nvidia-smi -r -i <index>`) or reboot")
    return None


def _limits(code: int, c: OpenContext, said: str) -> OpenCause | None:
    if code == e.EMFILE:
        return OpenCause(f"{said}: this process has as many files open as RLIMIT_NOFILE lets it",
                         "raise it: `ulimit -n 65536`, or `--ulimit nofile=65536` in Docker")
    if code == e.ENFILE:
        return OpenCause(f"{said}: the system's table of open files is full",
                         "raise `fs.file-max` (sysctl) or stop what holds so many files")
    if code == e.ENOMEM:
        return OpenCause(f"{said}: the kernel is out of memory", "free memory; check dmesg")
    return None
