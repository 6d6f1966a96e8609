"""One run per folder: a start of `mgpu train` holds its run folder until it ends.

The hold is a POSIX record lock (`fcntl.lockf`, fcntl(2) F_SETLK) on `run.lock` in the run
folder. The kernel drops it when the process ends, however it ends (kill -9 included), so a
requeued job whose predecessor is really gone takes it at once, with no manual step; the
record of the last holder (`run.lock.json`: host, pid, since when, the command) is only for
the message a second start gets, and is overwritten by the next holder.

Why POSIX record locks and not flock(2): they are the locks NFS carries to the server (NLM
for NFSv3, the protocol itself for NFSv4), so two machines that mount one folder see each
other's; flock(2) reaches an NFS server only because Linux (since 2.6.12) emulates it with
the same byte-range locks, was local-only before that, and on CIFS before Linux 5.5 and on
mounts with `local_lock` it is never sent to the server. A POSIX lock belongs to the process
and is dropped by *any* close of the file in it, so this module is the only code that opens
`run.lock`, once per process. An NFS client that dies without unlocking (its machine lost)
keeps the lock until the server's lease ends (NFSv4: 90 s by default).

Workers of one run: `mgpu train --workers N` (the launcher) holds the folder for the whole
run, restarts included, and names itself to its workers (`HELD_BY_ENV`); its chief then
finds the folder held by its own parent and goes on. A cluster started by its engine
(Slurm, Kubernetes): the chief holds it; the other workers write no run folder and hold
nothing (a chief refused with exit 2 leaves them to their WORKER_TIMEOUT).

A file system that takes no locks (ENOLCK, EOPNOTSUPP, ENOSYS: NFS mounted `nolock`, Lustre
without `-o flock`) is said in the start summary; the record then still refuses a second
start on the same machine while the process it names lives.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.hardware.folders import folder_access
from mgpu_env.training.shared.atomic import atomic_write_json
from mgpu_env.training.shared.messages import unwritable_folder

LOCK_FILE = "run.lock"
HOLDER_FILE = "run.lock.json"
# Set by the launcher for its workers: the pid of the process that holds the run folder.
HELD_BY_ENV = "MGPU_RUN_FOLDER_HELD_BY"
# errno values that say the file system takes no locks at all (not that one is held).
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run folder, as `run.lock.json` records it."""

    host: str
    pid: int
    since: float  # seconds since the epoch
    command: str

    @classmethod
    def this_process(cls, argv: Sequence[str] | None = None) -> Holder:
        if argv is None:  # `python -m entrypoint train` is mgpu train too
            program = Path(sys.argv[0]).name
            argv = ["mgpu" if program in ("mgpu", "__main__.py") else sys.argv[0],
                    *sys.argv[1:]]
        return cls(socket.gethostname(), os.getpid(), time.time(), " ".join(argv))

    def describe(self) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.host}, since {stamp} ({self.command})"

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "since": self.since,
                "command": self.command}


@dataclass
class FolderHold:
    """A run folder held by this process (`fd`), by its launcher (`fd` None), or not
    lockable here (`note` says so). `release()` (or the process's end) lets it go."""

    folder: Path
    fd: int | None
    notes: tuple[str, ...] = ()
    created: bool = False  # the hold made the folder: a start refused before writing leaves none

    def release(self) -> None:
        if self.fd is None:
            return
        holder = read_holder(self.folder)
        if holder is not None and holder.pid == os.getpid():
            (self.folder / HOLDER_FILE).unlink(missing_ok=True)
        if self.created:
            self._remove_if_unused()
        os.close(self.fd)  # drops the lock
        self.fd = None

    def _remove_if_unused(self) -> None:
        """A start refused before it wrote anything (bad data, a GPU too small) leaves no run
        folder behind, as before the folder was held: removed, still under the lock, when it
        holds nothing but the lock's own file."""
        try:
            if {p.name for p in self.folder.iterdir()} == {LOCK_FILE}:
                (self.folder / LOCK_FILE).unlink()
                self.folder.rmdir()
        except OSError:  # a file appeared meanwhile, or it cannot be listed: keep the folder
            pass

    def __enter__(self) -> FolderHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_holder(folder: Path) -> Holder | None:
    """The last holder's record; None when there is none or it cannot be read (it is only
    for the message: the lock decides)."""
    try:
        data = json.loads((folder / HOLDER_FILE).read_text(encoding="utf-8"))
        return Holder(str(data["host"]), int(data["pid"]), float(data["since"]),
                      str(data["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def hold_run_folder(
    folder: Path, environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> FolderHold:
    """Hold `folder` (created if missing) for this process, or raise ConfigError (exit 2)
    naming the process that holds it and what to do. Refuses a folder this user cannot
    write before trying."""
    environ = os.environ if environ is None else environ
    access = folder_access(folder)
    if access.problem() is not None:
        raise ConfigError(unwritable_folder(access))
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:  # a refused start's empty folder removed in between: once more
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)  # this process holds no lock on it: closing drops nothing
        if err.errno in (errno.EACCES, errno.EAGAIN):
            return _held_already(folder, environ)
        if err.errno in NO_LOCKS:
            return _without_locks(folder, err, argv, environ)
        raise ConfigError(f"{folder / LOCK_FILE} cannot be locked ({err.strerror}).\n"
                          "  Fix: choose an OUTPUT_DIR on another file system.") from None
    atomic_write_json(folder / HOLDER_FILE, Holder.this_process(argv).as_dict())
    return FolderHold(folder, fd, created=created)


def _held_already(folder: Path, environ: Mapping[str, str]) -> FolderHold:
    """The lock is taken: by this process's launcher (its workers go on), else refused."""
    holder = read_holder(folder)
    if _our_launcher(holder, environ):
        return _under_launcher(folder)
    raise ConfigError(held_message(folder, holder))


def _our_launcher(holder: Holder | None, environ: Mapping[str, str]) -> bool:
    """Whether the holder is the launcher that started this process and named itself."""
    parent = os.getppid()
    return (holder is not None and environ.get(HELD_BY_ENV) == str(parent)
            and holder.pid == parent and holder.host == socket.gethostname())


def _under_launcher(folder: Path) -> FolderHold:
    return FolderHold(folder, None,
                      (f"the run folder is held by the launcher, pid {os.getppid()}",))


def held_message(folder: Path, holder: Holder | None) -> str:
    """A second start's refusal: who holds the folder and the three ways on."""
    who = holder.describe() if holder is not None else (
        f"a process whose record ({HOLDER_FILE}) cannot be read")
    pid = holder.pid if holder is not None else "PID"
    return (
        f"OUTPUT_DIR={folder} is held by another start of mgpu train: {who}. Two runs in "
        "one folder would delete each other's checkpoints.\n"
        "  Fix: wait for it to end (then start again to resume it), stop it (`kill "
        f"{pid}`: it saves a checkpoint, and this command then resumes), or train another "
        "run: another RUN_NAME or OUTPUT_DIR."
    )


def _without_locks(folder: Path, err: OSError, argv: Sequence[str] | None,
                   environ: Mapping[str, str]) -> FolderHold:
    """A file system without locks: the record alone refuses a second start on this
    machine while its holder lives; the start summary says what is not protected."""
    holder = read_holder(folder)
    if _our_launcher(holder, environ):
        return _under_launcher(folder)
    if holder is not None and holder.host == socket.gethostname() and _alive(holder.pid):
        raise ConfigError(held_message(folder, holder))
    atomic_write_json(folder / HOLDER_FILE, Holder.this_process(argv).as_dict())
    code = errno.errorcode.get(err.errno or 0, str(err.errno))
    note = (
        f"{folder} is on a file system that takes no locks ({code}: {err.strerror}): a "
        "second start on another machine is not refused. Fix: mount "
        "it with locking (NFS: without `nolock`; Lustre: `-o flock`), or choose an "
        "OUTPUT_DIR on a file system that locks"
    )
    return FolderHold(folder, None, (note,))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()
