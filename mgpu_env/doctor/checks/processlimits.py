"""The process limits TensorFlow meets, against what this machine makes it ask for.

The process limits TensorFlow meets when it starts its pools and allocates, each against what
this machine's CPU and GPU count make it ask for (`doctor.demand`): threads (RLIMIT_NPROC, the
cgroup's pids.max, the kernel's threads-max and pid_max), host memory (the cgroup's memory.max
and memory.high, RLIMIT_DATA), address space (RLIMIT_AS), open files (RLIMIT_NOFILE). `limits`
reports them with `gpulimits`' (/dev/shm, memlock, stack).

Each check says the value read, what TensorFlow will ask for and how that number was made, what
TensorFlow prints when the limit stops it, and the setting that lifts it where the limit is set
(docker run, compose, Kubernetes, Slurm, the shell). A limit that could not be read is a
warning that says why, never `ok`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mgpu_env.doctor.checks.common import Check, CheckId, Skipped, Status
from mgpu_env.doctor.demand import Demand, Sizing, demand_for, size_text
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware.limits import MachineLimits, Rlimit

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
LIMITS_THREADS = CheckId("limits.threads")
LIMITS_MEMORY = CheckId("limits.memory")
LIMITS_ADDRESS_SPACE = CheckId("limits.address_space")
LIMITS_OPEN_FILES = CheckId("limits.open_files")

NOT_PROBED = Skipped("limits", "the machine's limits were not read")
THREAD_FAILURE = (
    "TensorFlow aborts when a pool's thread cannot start: `Check failed: ret == 0 (11 vs. 0) "
    "Thread tf_data_private_threadpool creation via pthread_create() failed`, `LLVM ERROR: "
    "pthread_create failed: Resource temporarily unavailable`, or `terminate called after "
    "throwing an instance of 'std::system_error' what(): Resource temporarily unavailable`"
)
FIX_UNREADABLE = (
    "read the limits by hand (`ulimit -a`, `cat /proc/self/limits /proc/self/cgroup`) and "
    "make them readable to this user (a hardened /proc: mount option hidepid)"
)
FIX_POOLS = (
    "or make TensorFlow ask for fewer: TF_NUM_INTEROP_THREADS=2 TF_NUM_INTRAOP_THREADS=<CPUs>"
)


@dataclass(frozen=True)
class Room:
    """One bound on a resource: what is left under it, and where it is set."""

    source: str  # "RLIMIT_NPROC 4096, 4000 threads of uid 1000 in use"
    left: int
    fix: str


def demand_of(facts: Facts, limits: MachineLimits) -> Demand:
    """TensorFlow's demand for the CPUs this process may use and the GPUs training uses."""
    cpus = limits.cpus.value if limits.cpus.ok and limits.cpus.value else 1
    rlimits = limits.rlimits.value or {}
    stack = rlimits["stack"].soft if "stack" in rlimits else None
    total = limits.meminfo.value[0] if limits.meminfo.ok and limits.meminfo.value else 0
    gpu_memory = sum((g.memory_total_mib.value or 0) * 1024 * 1024 for g in facts.selected)
    pools = _pools(facts.environ)
    return demand_for(Sizing(
        cpus, len(facts.selected), stack_soft=stack, host_memory=total, gpu_memory=gpu_memory,
        shm_disabled=facts.environ.get("NCCL_SHM_DISABLE", "").strip() == "1", pools=pools))


def _pools(environ: dict[str, str]) -> tuple[int, int] | None:
    values = [environ.get(n, "").strip() for n in ("TF_NUM_INTEROP_THREADS",
                                                   "TF_NUM_INTRAOP_THREADS")]
    if all(v.isdigit() and int(v) > 0 for v in values):
        return int(values[0]), int(values[1])
    return None


def _judge(
    check_id: CheckId, title: str, facts: Facts,
    judge: Callable[[MachineLimits, Demand], Check],
) -> Check:
    limits = facts.host.limits
    if limits is None:
        return check_id(title, "skip", "not read", skipped_for=NOT_PROBED)
    return judge(limits, demand_of(facts, limits))


def rlimit_of(limits: MachineLimits, name: str) -> Rlimit | None:
    return (limits.rlimits.value or {}).get(name) if limits.rlimits.ok else None


def _bound(rooms: list[Room], unreadable: list[str], need: int) -> tuple[Status, str, str]:
    """The status, the finding and the fix from the bounds on one resource."""
    tight = min(rooms, key=lambda r: r.left) if rooms else None
    found = "; ".join(r.source for r in rooms) or "no limit"
    if unreadable:
        found += "; could not collect " + ", ".join(unreadable)
    if tight is not None and tight.left < need:
        return "error", found, tight.fix
    if unreadable:
        return "warn", found, FIX_UNREADABLE
    return "ok", found, ""


# ---------------------------------------------------------------------------- threads


def _thread_rooms(limits: MachineLimits, need: int) -> tuple[list[Room], list[str], str]:
    """The bounds on threads, the limits that could not be read, and a note on RLIMIT_NPROC
    where the kernel does not apply it to this process."""
    rooms: list[Room] = []
    unreadable: list[str] = []
    note = ""
    wanted = 2 * need
    nproc = rlimit_of(limits, "nproc")
    exempt = limits.identity.value.nproc_exempt if limits.identity.value else False
    if nproc is None:
        unreadable.append(f"/proc/self/limits ({limits.rlimits.error})")
    elif nproc.soft is not None and exempt:
        note = f"RLIMIT_NPROC {nproc.soft} (not applied: root or CAP_SYS_RESOURCE)"
    elif nproc.soft is not None:
        used = limits.user_threads.value or 0
        rooms.append(Room(
            f"RLIMIT_NPROC {nproc.soft}, {used} thread(s) of this user in use", nproc.soft - used,
            f"raise the user's process limit: docker run --ulimit nproc={wanted * 4}, compose "
            f"`ulimits: {{nproc: {wanted * 4}}}`; a shell: `ulimit -u {wanted * 4}` "
            "(/etc/security/limits.conf `nproc`); Slurm copies the submitting shell's limits "
            "(PropagateResourceLimits): raise it before sbatch, or `srun --propagate=NONE`"))
    cgroup = limits.cgroup
    if not cgroup.ok or cgroup.value is None:
        unreadable.append(f"the cgroup ({cgroup.error})")
    else:
        unreadable += [u for u in cgroup.value.unreadable if u.startswith("pids.")]
        if cgroup.value.pids_max is not None:
            used = cgroup.value.pids_current or 0
            rooms.append(Room(
                f"cgroup v{cgroup.value.version} pids.max {cgroup.value.pids_max}, {used} in use",
                cgroup.value.pids_max - used,
                f"raise the cgroup's task limit: docker run --pids-limit={wanted * 4} (or -1), "
                f"compose `pids_limit: {wanted * 4}`; Kubernetes: the kubelet's podPidsLimit; "
                "systemd: TasksMax= of the unit or slice; Slurm: the job's cgroup"))
    kernel = limits.kernel
    if kernel.ok and kernel.value is not None:
        now = kernel.value.threads_now
        for name, value in (("threads-max", kernel.value.threads_max),
                            ("pid_max", kernel.value.pid_max)):
            sysctl = f"kernel.{name.replace('-', '_')}={max(value * 2, 4 * wanted)}"
            rooms.append(Room(f"kernel {name} {value}, {now} threads on the machine",
                              value - now, f"on the host: `sysctl -w {sysctl}`"))
    else:
        unreadable.append(f"/proc/sys/kernel ({kernel.error})")
    return rooms, unreadable, note


def check_threads(facts: Facts) -> Check:
    title = "Thread limits"

    def judge(limits: MachineLimits, demand: Demand) -> Check:
        expected = f"room for {demand.threads} threads ({demand.why_threads()})"
        rooms, unreadable, note = _thread_rooms(limits, demand.threads)
        status, found, fix = _bound(rooms, unreadable, demand.threads)
        found = f"{note}; {found}" if note else found
        if status == "error":
            found += f": {THREAD_FAILURE}"
            fix += f"; {FIX_POOLS}"
        return LIMITS_THREADS(title, status, found, expected, fix)

    return _judge(LIMITS_THREADS, title, facts, judge)


# ----------------------------------------------------------------------------- memory


def check_memory(facts: Facts) -> Check:
    title = "Memory limits"

    def judge(limits: MachineLimits, demand: Demand) -> Check:
        expected = f"{size_text(demand.memory)} for TensorFlow ({demand.why_memory()})"
        rooms: list[Room] = []
        unreadable: list[str] = []
        cgroup = limits.cgroup.value
        if cgroup is None:
            unreadable.append(f"the cgroup ({limits.cgroup.error})")
        else:
            unreadable += [u for u in cgroup.unreadable if u.startswith("memory.")]
            if cgroup.memory_max is not None:
                used = cgroup.memory_current or 0
                rooms.append(Room(
                    f"cgroup memory.max {size_text(cgroup.memory_max)} ({size_text(used)} in "
                    "use)", cgroup.memory_max - used,
                    "the kernel's OOM killer ends training (SIGKILL, exit 137): raise the "
                    "container's memory (docker run --memory, compose `mem_limit:` or "
                    "deploy.resources.limits.memory), the pod's resources.limits.memory, or "
                    "Slurm's --mem / --mem-per-gpu"))
        data = rlimit_of(limits, "data")
        if data is None:
            unreadable.append(f"/proc/self/limits ({limits.rlimits.error})")
        elif data.soft is not None:
            rooms.append(Room(
                f"RLIMIT_DATA {size_text(data.soft)}", data.soft,
                "allocations fail (std::bad_alloc, `OOM when allocating tensor`): `ulimit -d "
                "unlimited` (limits.conf `data`), docker run --ulimit data=-1"))
        status, found, fix = _bound(rooms, unreadable, demand.memory)
        if status == "ok" and cgroup is not None and cgroup.memory_high is not None \
                and cgroup.memory_high < demand.memory:
            return LIMITS_MEMORY(
                title, "warn",
                f"{found}; memory.high {size_text(cgroup.memory_high)}", expected,
                "above memory.high the kernel throttles and reclaims: training slows "
                "to a crawl; raise it (systemd MemoryHigh=, the pod's limits)")
        return LIMITS_MEMORY(title, status, found, expected, fix)

    return _judge(LIMITS_MEMORY, title, facts, judge)


def check_address_space(facts: Facts) -> Check:
    title = "Address space limit"

    def judge(limits: MachineLimits, demand: Demand) -> Check:
        expected = (f"unlimited, or more than {size_text(demand.address_space)} (TensorFlow's "
                    f"libraries and malloc arenas, {demand.threads} thread stacks of "
                    f"{size_text(demand.thread_stack)}"
                    + (", CUDA's reservation: host memory + the GPUs' memory)" if demand.gpus
                       else ")"))
        rlimit = rlimit_of(limits, "as")
        if rlimit is None:
            return LIMITS_ADDRESS_SPACE(title, "warn", limits.rlimits.text(), expected,
                                        FIX_UNREADABLE)
        found = f"RLIMIT_AS soft {size_text(rlimit.soft)}, hard {size_text(rlimit.hard)}"
        if rlimit.soft is None:
            return LIMITS_ADDRESS_SPACE(title, "ok", found, expected)
        fix = ("`ulimit -v unlimited` before mgpu (limits.conf `as`); docker run --ulimit as=-1; "
               "under Slurm the job's limit comes from VSizeFactor in slurm.conf (ask for it "
               "off) or from the submitting shell (PropagateResourceLimits)")
        consequence = ("; thread stacks cannot be mapped (`Resource temporarily unavailable`)"
                       + ("; CUDA cannot reserve its address space: `failed call to cuInit: "
                          "CUDA_ERROR_OUT_OF_MEMORY`" if demand.gpus else ""))
        if rlimit.soft < demand.address_space:
            return LIMITS_ADDRESS_SPACE(title, "error", found + consequence, expected,
                                        fix)
        if demand.gpus:
            return LIMITS_ADDRESS_SPACE(
                title, "warn",
                found + " (above the estimate, but CUDA's reservation grows with the "
                "GPUs' and the host's memory: only unlimited is certain)", expected, fix)
        return LIMITS_ADDRESS_SPACE(title, "ok", found, expected)

    return _judge(LIMITS_ADDRESS_SPACE, title, facts, judge)


def check_open_files(facts: Facts) -> Check:
    title = "Open files limit"

    def judge(limits: MachineLimits, demand: Demand) -> Check:
        expected = (f"{demand.open_files} or more (64 + 32 x {demand.gpus} GPU(s) + "
                    f"{demand.cpus} tf.data reader(s))")
        rlimit = rlimit_of(limits, "nofile")
        if rlimit is None:
            return LIMITS_OPEN_FILES(title, "warn", limits.rlimits.text(), expected,
                                     FIX_UNREADABLE)
        found = (f"RLIMIT_NOFILE soft {size_or_count(rlimit.soft)}, "
                 f"hard {size_or_count(rlimit.hard)}")
        if rlimit.soft is None or rlimit.soft >= demand.open_files:
            return LIMITS_OPEN_FILES(title, "ok", found, expected)
        raise_to = rlimit.hard if rlimit.hard is None or rlimit.hard >= demand.open_files \
            else None
        fix = (f"`ulimit -n {raise_to or 'unlimited'}` before mgpu (up to the hard limit needs "
               "no root)" if raise_to or rlimit.hard is None else
               "raise the hard limit: docker run --ulimit nofile=1048576:1048576, compose "
               "`ulimits: {nofile: 1048576}`, limits.conf `nofile`")
        return LIMITS_OPEN_FILES(
            title, "error",
            found + ": opening a file, a socket or a GPU fails with `Too many open "
            "files` (EMFILE)", expected, fix)

    return _judge(LIMITS_OPEN_FILES, title, facts, judge)


def size_or_count(value: int | None) -> str:
    return "unlimited" if value is None else str(value)

