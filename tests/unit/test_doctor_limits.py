"""Every limit that stops TensorFlow, walked: each kind (RLIMIT_NPROC, pids.max v2 and v1,
threads-max, memory.max v2 and v1, RLIMIT_DATA, RLIMIT_AS, RLIMIT_NOFILE, /dev/shm, memlock,
stack) x (unlimited, ample, just enough, too small, unreadable), each laid out as files under
MGPU_HOST_ROOT and read by the real probe (`hardware.limits.collect`); nothing of the doctor is
replaced. The boundary is the demand the model gives for the fake machine (8 CPUs, 4 GPUs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.doctor.checks import Check, run_checks
from mgpu_env.doctor.checks.processlimits import check_threads, demand_of
from mgpu_env.doctor.demand import NCCL_SHM_SEGMENT, Sizing, demand_for
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import limits as machine_limits
from mgpu_env.hardware.cgroups import cpu_list_count, parse_proc_cgroup
from tests.support.fake_doctor import healthy_host, make_facts, tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakelimits import GIB, MIB, host_root, lay_out, limits_text

Install = Callable[[FakeNvml], FakeNvml]
GPUS = 4
USED = 40  # threads of the user, pids in the cgroup (lay_out's default user_threads)
MEMORY_USED = 1 * GIB
LIMIT_IDS = ("limits.threads", "limits.memory", "limits.address_space", "limits.open_files",
             "container.shm", "container.memlock", "container.stack")


def facts_on(root: Path, gpus: int = GPUS, environ: dict[str, str] | None = None,
             **machine: Any) -> Facts:
    lay_out(root, **machine)
    with host_root(root):
        probed = machine_limits.collect()
    return make_facts("all", host=healthy_host(limits=probed), environ=environ)


def by_id(facts: Facts) -> dict[str, Check]:
    """The checks by id; where every process limit holds, the one `limits` line stands for
    each of them (limits.threads, limits.memory, ...)."""
    checks = {c.id: c for c in run_checks(facts)}
    if "limits" in checks:
        assert checks["limits"].status == "ok"
        checks.update(dict.fromkeys(LIMIT_IDS, checks["limits"]))
    return checks


@dataclass(frozen=True)
class Kind:
    """One limit: the check that judges it, how a value is laid out, the demand it must hold,
    the file that holds it (made unreadable by a folder in its place), the status when short."""

    check: str
    machine: Callable[[int | None], dict[str, Any]]
    need: Callable[[Any], int]
    file: str
    short: str = "error"
    finite: str = "ok"  # a finite value that holds the demand


def _v1(files: dict[str, str]) -> dict[str, Any]:
    return {"cgroup": "v1", "cgroup_path": "/docker/abc", "cgroup_files": files}


KINDS = {
    "nproc": Kind("limits.threads", lambda v: {"rlimits": {"nproc": (
        None if v is None else v + USED, None if v is None else v + USED)}},
        lambda d: d.threads, "/proc/self/limits"),
    "pids.max v2": Kind("limits.threads", lambda v: {"cgroup_path": "/job", "cgroup_files": {
        "pids.max": "max" if v is None else str(v + USED), "pids.current": str(USED)}},
        lambda d: d.threads, "/sys/fs/cgroup/job/pids.max"),
    "pids.max v1": Kind("limits.threads", lambda v: _v1({
        "pids.max": "max" if v is None else str(v + USED), "pids.current": str(USED)}),
        lambda d: d.threads, "/sys/fs/cgroup/pids/docker/abc/pids.max"),
    "threads-max": Kind("limits.threads", lambda v: {
        "threads_max": 2**22 if v is None else v + 500, "threads_now": 500},
        lambda d: d.threads, "/proc/sys/kernel/threads-max"),
    "memory.max v2": Kind("limits.memory", lambda v: {"cgroup_path": "/job", "cgroup_files": {
        "memory.max": "max" if v is None else str(v + MEMORY_USED),
        "memory.current": str(MEMORY_USED)}},
        lambda d: d.memory, "/sys/fs/cgroup/job/memory.max"),
    "memory.max v1": Kind("limits.memory", lambda v: _v1({
        "memory.limit_in_bytes": "9223372036854771712" if v is None else str(v + MEMORY_USED),
        "memory.usage_in_bytes": str(MEMORY_USED)}),
        lambda d: d.memory, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"),
    "data": Kind("limits.memory", lambda v: {"rlimits": {"data": (v, v)}},
                 lambda d: d.memory, "/proc/self/limits"),
    "as": Kind("limits.address_space", lambda v: {"rlimits": {"as": (v, v)}},
               lambda d: d.address_space, "/proc/self/limits", finite="warn"),
    "nofile": Kind("limits.open_files", lambda v: {"rlimits": {"nofile": (v, v)}},
                   lambda d: d.open_files, "/proc/self/limits"),
    # 4 GPUs without P2P between them: NCCL takes the shared-memory path.
    "shm": Kind("container.shm", lambda v: {"shm_size": 64 * GIB if v is None else v},
                lambda d: d.shm, "/dev/shm"),
    "stack": Kind("container.stack", lambda v: {"rlimits": {"stack": (v, None)}},
                  lambda d: 64 * MIB, "/proc/self/limits", short="warn"),
}


# The fake machine's demand: lay_out's 8 CPUs, 64 MiB stack and 64 GiB, 4 fake 80 GiB GPUs.
DEMAND = demand_for(Sizing(8, GPUS, stack_soft=64 * MIB, host_memory=64 * GIB,
                           gpu_memory=GPUS * 80 * GIB))


def test_the_demand_is_made_from_the_machine(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS))
    facts = facts_on(tmp_path)
    assert facts.host.limits is not None and demand_of(facts, facts.host.limits) == DEMAND


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("level", ["unlimited", "ample", "just enough", "too small",
                                   "unreadable"])
def test_each_limit_at_each_level(use_fake_nvml: Install, tmp_path: Path, kind: str,
                                  level: str) -> None:
    use_fake_nvml(fake_with(GPUS, p2p_ok=False))
    spec = KINDS[kind]
    need = spec.need(DEMAND)
    value = {"unlimited": None, "ample": 4 * need, "just enough": need,
             "too small": need - 1, "unreadable": 4 * need}[level]
    root = tmp_path / "machine"
    lay_out(root, **spec.machine(value))
    if level == "unreadable":
        target = root / spec.file.lstrip("/")
        if target.is_dir():
            target.rmdir()  # no /dev/shm at all
        else:
            target.unlink()
            target.mkdir(parents=True)  # a folder where the file was: read() fails (EISDIR)
    with host_root(root):
        probed = machine_limits.collect()
    check = by_id(make_facts("all", host=healthy_host(limits=probed)))[spec.check]
    expected = {"too small": spec.short, "unreadable": "warn", "ample": spec.finite,
                "just enough": spec.finite}.get(level, "ok")
    assert check.status == expected, check
    if check.status != "ok":
        assert check.found and check.expected and check.fix, check
    if level == "unreadable":
        assert "could not collect" in check.found


def test_every_consequence_names_what_tensorflow_prints(use_fake_nvml: Install,
                                                        tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS, p2p_ok=False))
    facts = facts_on(tmp_path, rlimits={"nproc": (60, 60), "as": (8 * GIB, 8 * GIB),
                                        "nofile": (128, 4096)}, shm_size=64 * MIB)
    checks = by_id(facts)
    assert "pthread_create() failed" in checks["limits.threads"].found
    assert "Resource temporarily unavailable" in checks["limits.threads"].found
    assert "--ulimit nproc=" in checks["limits.threads"].fix
    assert "CUDA_ERROR_OUT_OF_MEMORY" in checks["limits.address_space"].found
    assert "unhandled system error" in checks["container.shm"].found
    assert "--shm-size" in checks["container.shm"].fix and "ipc: host" in checks[
        "container.shm"].fix and "emptyDir" in checks["container.shm"].fix
    assert checks["limits.open_files"].status == "error"
    assert "ulimit -n 4096" in checks["limits.open_files"].fix  # up to the hard: no root


def test_a_limit_set_on_an_ancestor_cgroup_binds(use_fake_nvml: Install,
                                                 tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS))
    root = tmp_path / "m"
    lay_out(root, cgroup_path="/slurm/job_7/step_0", cgroup_files={"pids.max": "max"})
    (root / "sys/fs/cgroup/slurm/job_7/pids.max").write_text("64\n")
    (root / "sys/fs/cgroup/slurm/job_7/pids.current").write_text("30\n")
    with host_root(root):
        probed = machine_limits.collect()
    assert probed.cgroup.value is not None and probed.cgroup.value.pids_max == 64
    check = by_id(make_facts("all", host=healthy_host(limits=probed)))["limits.threads"]
    assert check.status == "error" and "pids.max 64, 30 in use" in check.found
    assert "--pids-limit" in check.fix and "podPidsLimit" in check.fix


def test_a_container_without_its_own_cgroup_namespace_reads_the_mount(tmp_path: Path) -> None:
    lay_out(tmp_path, cgroup_files={"pids.max": "100", "pids.current": "5"})
    (tmp_path / "proc/self/cgroup").write_text("0::/system.slice/docker-abc.scope\n")
    with host_root(tmp_path):
        cgroup = machine_limits.collect().cgroup.value
    assert cgroup is not None and cgroup.pids_max == 100 and "not under" in cgroup.note


@pytest.mark.parametrize("cgroup", ["v2", "v1", "none"])
def test_every_cgroup_version_on_a_healthy_machine_raises_nothing(
    use_fake_nvml: Install, tmp_path: Path, cgroup: str,
) -> None:
    use_fake_nvml(fake_with(8, nvlink=True))
    checks = by_id(facts_on(tmp_path, gpus=8, cgroup=cgroup, cgroup_files={
        "pids.max": "max", "memory.max": "max"} if cgroup == "v2" else {}))
    assert {i: checks[i].status for i in LIMIT_IDS} == dict.fromkeys(LIMIT_IDS, "ok")


def test_root_is_not_held_to_rlimit_nproc(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS))
    facts = facts_on(tmp_path, uid=0, rlimits={"nproc": (10, 10)})
    check = check_threads(facts)
    assert check.status == "ok" and "not applied" in check.found


def test_capability_sys_resource_lifts_rlimit_nproc(tmp_path: Path) -> None:
    lay_out(tmp_path, capabilities=1 << machine_limits.CAP_SYS_RESOURCE)
    with host_root(tmp_path):
        who = machine_limits.collect().identity.value
    assert who is not None and who.nproc_exempt


def test_the_users_pools_shrink_the_demand(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS))
    need = demand_for(Sizing(8, GPUS)).threads
    small = need - 6  # room for 2 + 2 pool threads instead of 8 + 8
    facts = facts_on(tmp_path, rlimits={"nproc": (small + USED, small + USED)},
                     environ={"TF_NUM_INTEROP_THREADS": "2", "TF_NUM_INTRAOP_THREADS": "2"})
    assert by_id(facts)["limits.threads"].status == "ok"


def test_memory_high_below_the_demand_warns(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS))
    check = by_id(facts_on(tmp_path, cgroup_path="/job", cgroup_files={
        "memory.max": "max", "memory.high": str(2 * GIB)}))["limits.memory"]
    assert check.status == "warn" and "memory.high" in check.found


def test_a_finite_address_space_above_the_estimate_still_warns_with_gpus(
    use_fake_nvml: Install, tmp_path: Path,
) -> None:
    use_fake_nvml(fake_with(GPUS))
    check = by_id(facts_on(tmp_path, rlimits={"as": (2**50, 2**50)}))["limits.address_space"]
    assert check.status == "warn" and "only unlimited is certain" in check.found
    use_fake_nvml(fake_with(0))
    cpu_only = by_id(facts_on(tmp_path / "cpu", rlimits={"as": (2**50, 2**50)}))
    assert cpu_only["limits.address_space"].status == "ok"


@pytest.mark.parametrize(("soft", "gpus", "hcas", "status"), [
    (None, GPUS, False, "ok"), (64 * MIB, 0, False, "ok"), (64 * MIB, GPUS, False, "warn"),
    (64 * MIB, GPUS, True, "error"),
])
def test_memlock(use_fake_nvml: Install, tmp_path: Path,
                 soft: int | None, gpus: int, hcas: bool, status: str) -> None:
    use_fake_nvml(fake_with(gpus))
    root = tmp_path / "m"
    lay_out(root, rlimits={"memlock": (soft, soft)})
    settings = {}
    if hcas:  # two workers over InfiniBand: NCCL registers its buffers against memlock
        (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
        settings = {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                                 '"task": {"type": "worker", "index": 0}}'}
    with host_root(root):
        probed = machine_limits.collect()
        facts = make_facts("all", host=healthy_host(limits=probed), settings=settings)
    if hcas:
        assert facts.nccl is not None and facts.nccl.hcas == ("mlx5_0",)
        assert facts.cluster.cluster is not None, facts.cluster
    check = by_id(facts)["container.memlock"]
    assert check.status == status, check
    if status != "ok":
        assert "memlock=-1" in check.fix and "LimitMEMLOCK" in check.fix


def test_shm_with_p2p_between_the_gpus_warns_rather_than_fails(
    use_fake_nvml: Install, tmp_path: Path,
) -> None:
    use_fake_nvml(fake_with(GPUS, p2p_ok=True))
    check = by_id(facts_on(tmp_path, shm_size=64 * MIB))["container.shm"]
    assert check.status == "warn" and "P2P" in check.found
    need = 2 * NCCL_SHM_SEGMENT * 6
    assert f"{need / MIB:.0f} MiB" in check.expected


def test_shm_held_by_other_files_counts_against_the_room(use_fake_nvml: Install,
                                                         tmp_path: Path) -> None:
    use_fake_nvml(fake_with(GPUS, p2p_ok=False))
    # 120 MiB would hold NCCL's 110 MiB; 16 MiB already held leaves too little.
    check = by_id(facts_on(tmp_path, shm_size=120 * MIB, shm_used=16 * MIB))
    assert check["container.shm"].status == "error"


def test_no_limits_read_skips_the_checks(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    checks = by_id(make_facts("all", host=healthy_host(limits=None)))
    assert {checks[i].status for i in LIMIT_IDS} == {"skip"}
    assert checks["limits.threads"].skipped_for is not None


def test_parsers() -> None:
    rows = machine_limits.parse_limits(limits_text({"nproc": (4096, 8192), "stack": (
        8 * MIB, None), "nofile": (1024, 1048576), "memlock": (65536, 65536), "as": (None, None),
        "data": (None, None)}))
    assert rows["nproc"] == machine_limits.Rlimit(4096, 8192)
    assert rows["stack"] == machine_limits.Rlimit(8 * MIB, None)
    with pytest.raises(ValueError, match="no row for"):
        machine_limits.parse_limits("Limit  Soft Limit  Hard Limit  Units\n")
    assert cpu_list_count("0-3,8,10-11\n") == 7
    assert parse_proc_cgroup("4:cpu,cpuacct:/a\n1:name=systemd:/\n0::/b\n") == (
        "/b", {"cpu": ("cpu,cpuacct", "/a"), "cpuacct": ("cpu,cpuacct", "/a")})
    assert machine_limits.tmpfs_size("shm /dev/shm tmpfs rw,size=65536k 0 0\n",
                                     "/dev/shm") == 64 * MIB


def test_the_real_machine_is_read_without_error() -> None:
    real = machine_limits.collect()
    assert real.rlimits.ok and real.cpus.ok and real.meminfo.ok, real


def test_a_tensorflow_probe_does_not_change_the_verdict(use_fake_nvml: Install,
                                                        tmp_path: Path) -> None:
    use_fake_nvml(fake_with(2))
    lay_out(tmp_path)
    with host_root(tmp_path):
        probed = machine_limits.collect()
    facts = make_facts("all", tf=tf_facts(2), host=healthy_host(limits=probed))
    assert all(by_id(facts)[i].status == "ok" for i in LIMIT_IDS)


def test_a_bug_report_line_says_what_was_read(tmp_path: Path) -> None:
    lay_out(tmp_path, rlimits={"nproc": (4096, 8192)}, cgroup_path="/job",
            cgroup_files={"pids.max": "512", "memory.max": str(8 * GIB),
                          "cpu.max": "150000 100000"}, cpus="0-3")
    with host_root(tmp_path):
        line = machine_limits.describe(machine_limits.collect())
    assert "nproc 4096/8192" in line and "pids.max 512" in line
    assert f"memory.max {8 * GIB}" in line and "4 CPUs allowed" in line
    assert "CPU quota 1.5" in line


def test_cgroup_v1_cpu_quota_and_cpuset(tmp_path: Path) -> None:
    lay_out(tmp_path, cgroup="v1", cgroup_path="/docker/abc", cgroup_files={
        "cpu.cfs_quota_us": "200000", "cpu.cfs_period_us": "100000",
        "cpuset.effective_cpus": "0-1,4"})
    with host_root(tmp_path):
        cgroup = machine_limits.collect().cgroup.value
    assert cgroup is not None and cgroup.version == 1
    assert cgroup.cpu_quota == 2.0 and cgroup.cpuset == 3
