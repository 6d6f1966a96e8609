"""What a probe child's death by a signal means on this machine: every signal Linux defines.

The signals that end a process by default each get their meaning for a child that imports
TensorFlow and opens the GPUs, judged from this machine's facts (read under `hostroot`):

- SIGILL: an instruction the CPU does not have. TensorFlow's x86 pip wheels are built for AVX
  (and use AVX2/FMA where present); the CPU's flags (/proc/cpuinfo) say which are missing;
- SIGKILL: nearly always the kernel's OOM killer or a cgroup's memory limit
  (`memory.events` oom_kill, memory.max) when nobody sent it by hand;
- SIGBUS: a shared-memory file beyond /dev/shm's size, or a GPU that fell off the bus;
- SIGSEGV, SIGABRT, SIGFPE, SIGSYS (seccomp), SIGXCPU/SIGXFSZ (limits), the terminal and
  user signals, and every other one by its default action.

Signals whose default action is to ignore, or to stop, cannot end a child; when one is seen
anyway, it is said so.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from mgpu_env.hardware.hostroot import host_root

# The instruction sets TensorFlow's x86-64 pip wheels are compiled for (AVX since 1.6); the
# others they use where present.
TF_REQUIRED_FLAGS = ("avx",)
TF_USED_FLAGS = ("avx2", "fma")
_IGNORED = {signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH, signal.SIGCONT}
_STOPS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
_FIXED: dict[int, str] = {
    signal.SIGSEGV: "a segmentation fault: native code (TensorFlow, a CUDA library, the "
                    "driver) read memory it does not own; often libraries of mixed CUDA "
                    "versions (see the Libraries lines) or a driver older than the CUDA build",
    signal.SIGABRT: "it aborted itself: a C++ check failed (TensorFlow's `F ...] Check "
                    "failed`, an uncaught C++ exception); its last stderr lines say which",
    signal.SIGFPE: "an arithmetic fault in native code (division by zero)",
    signal.SIGSYS: "a system call this sandbox forbids (a seccomp profile): run the container "
                   "with Docker's default profile, or `--security-opt seccomp=unconfined` to "
                   "confirm",
    signal.SIGXCPU: "it used all the CPU time RLIMIT_CPU allows (`ulimit -t`)",
    signal.SIGXFSZ: "it wrote a file larger than RLIMIT_FSIZE allows (`ulimit -f`)",
    signal.SIGTERM: "something asked it to stop (a scheduler's time limit, `docker stop`, "
                    "`kill`)",
    signal.SIGINT: "interrupted from the terminal (Ctrl-C)",
    signal.SIGQUIT: "quit from the terminal (Ctrl-\\)",
    signal.SIGHUP: "its terminal or session went away",
    signal.SIGPIPE: "it wrote to a pipe nobody reads any more",
    signal.SIGTRAP: "a breakpoint or trace trap (a debugger, or a failed assertion compiled "
                    "as a trap)",
    signal.SIGALRM: "an alarm timer it set ran out",
    signal.SIGVTALRM: "a virtual timer ran out",
    signal.SIGPROF: "a profiling timer ran out (a profiler attached without its handler)",
    signal.SIGUSR1: "another process sent it SIGUSR1, which it had no handler for",
    signal.SIGUSR2: "another process sent it SIGUSR2, which it had no handler for",
    signal.SIGPWR: "a power failure was signalled",
    signal.SIGIO: "asynchronous I/O was signalled with no handler",
    signal.SIGSTKFLT: "a coprocessor stack fault (unused on current hardware)",
}


def name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


def _cpu_flags(root: Path) -> frozenset[str] | None:
    try:
        text = (root / "proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _illegal_instruction(root: Path) -> str:
    flags = _cpu_flags(root)
    if flags is None:
        return "an instruction this CPU does not have (/proc/cpuinfo unreadable)"
    if "Features" in (root / "proc/cpuinfo").read_text(errors="replace"):
        return "an instruction this CPU does not have (an ARM build for another CPU)"
    missing = [f.upper() for f in TF_REQUIRED_FLAGS if f not in flags]
    absent = [f.upper() for f in TF_USED_FLAGS if f not in flags]
    if missing:
        return (f"an instruction this CPU does not have: its flags lack {', '.join(missing)}, "
                "which TensorFlow's pip wheels are built for (a virtual machine that hides "
                "AVX, or a CPU older than 2011): enable AVX in the hypervisor's CPU model "
                "(`host-passthrough`), or build TensorFlow without it")
    extra = f" (it lacks {', '.join(absent)})" if absent else ""
    return ("an instruction this CPU does not have, although it has AVX" + extra +
            ": a TensorFlow built for a newer CPU (a wheel or image compiled with "
            "-march=native elsewhere); install the pip wheel")


def _killed(root: Path) -> str:
    kills = _oom_kills(root)
    said = (f"the kernel's OOM killer or a memory limit (this cgroup's memory.events counts "
            f"{kills} oom_kill)" if kills else
            "usually the kernel's OOM killer or a cgroup's memory limit (`sudo dmesg | grep "
            "-i -e oom -e 'Killed process'`)")
    return (f"killed with SIGKILL, which cannot be caught: {said}; give it more memory (a "
            "container's `--memory`, a job's `--mem`), or fewer GPUs/workers at once")


def _oom_kills(root: Path) -> int:
    for path in ("sys/fs/cgroup/memory.events", "sys/fs/cgroup/memory/memory.oom_control"):
        try:
            for line in (root / path).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return 0


def _bus_error(root: Path) -> str:
    try:
        stats = os.statvfs(root / "dev/shm")
        size = f"{stats.f_frsize * stats.f_blocks / 2**20:g} MiB"
    except OSError:
        size = "unknown size"
    return (f"a bus error: most often memory mapped from /dev/shm beyond its size ({size}; "
            "Docker's default is 64 MiB: `--shm-size=8g`, compose `shm_size`), or a GPU that "
            "fell off the bus (`sudo dmesg | grep -i xid`)")


def meaning(number: int, root: Path | None = None) -> str:
    """What the death of a probe child by signal `number` means on this machine."""
    root = host_root() if root is None else root
    if number == signal.SIGILL:
        return _illegal_instruction(root)
    if number == signal.SIGKILL:
        return _killed(root)
    if number == signal.SIGBUS:
        return _bus_error(root)
    if number in _FIXED:
        return _FIXED[number]
    if number in _IGNORED:
        return "a signal whose default action is to ignore it: it cannot end a process"
    if number in _STOPS:
        return "a signal that stops a process, not ends it: something stopped the child"
    return "another process sent it, and its default action ends the process"


def describe(returncode: int, root: Path | None = None) -> str | None:
    """`killed by SIGILL: <meaning>` for a negative return code (Python's way of saying a
    child died by a signal); None for a normal exit."""
    if returncode >= 0:
        return None
    return f"killed by {name(-returncode)}: {meaning(-returncode, root)}"
