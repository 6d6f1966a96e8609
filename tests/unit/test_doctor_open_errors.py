"""The models under the chain walked over their whole input space: every errno Linux defines
for an open of a device file, every signal for a probe child, every bound driver's kind, and
the assignment variables as untrusted text. Pure functions of their inputs (and, for the
signals, of a fake /proc and /sys under a root folder)."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

from mgpu_env.hardware import assignment, devopen, openerrors, pcibus, signals
from mgpu_env.hardware.openerrors import OpenContext
from tests.support.fakemachine import Machine, build

DOCUMENTED = ("EACCES", "EBUSY", "EINTR", "EISDIR", "ELOOP", "EMFILE", "ENAMETOOLONG",
              "ENFILE", "ENODEV", "ENOENT", "ENOMEM", "ENOTDIR", "ENXIO", "EPERM", "EROFS",
              "EWOULDBLOCK", "EIO")
FLAGS_ONLY = ("EBADF", "EDQUOT", "EEXIST", "EFAULT", "EFBIG", "EINVAL", "ENOSPC",
              "EOPNOTSUPP", "EOVERFLOW", "ETXTBSY")


@pytest.mark.parametrize("code", sorted(errno.errorcode))
def test_every_errno_is_explained(code: int) -> None:
    found = openerrors.explain(code, OpenContext("/dev/nvidia0", "crw-rw-rw-", "root"))
    name = errno.errorcode[code]
    assert f"open(/dev/nvidia0) failed: {name}" in found.cause
    assert found.fix and not found.intended
    known = {getattr(errno, n) for n in DOCUMENTED + FLAGS_ONLY}
    generic = "not an answer open(2) documents" in found.cause
    assert generic == (code not in known), name
    if code in {getattr(errno, n) for n in FLAGS_ONLY}:
        assert "cannot come from this open" in found.cause


@pytest.mark.parametrize(("code", "context", "words"), [
    (errno.EACCES, OpenContext("/dev/nvidia0", "crw-rw----", "video", 1000, ("user",),
                               mode_allows=False), ("group video", "uid 1000", "usermod -aG")),
    (errno.EACCES, OpenContext("/dev/nvidia0", "crw-rw-rw-", "root", in_container=True),
     ("daemon-reload", "create-dev-char-symlinks")),
    (errno.EPERM, OpenContext("/dev/nvidia0", "crw-rw-rw-", rules="c 195:1 rwm"),
     ("device rules do not", "c 195:1 rwm")),
    (errno.EPERM, OpenContext("/dev/nvidia0", "crw-rw-rw-"), ("AppArmor", "nodev")),
    (errno.ENOENT, OpenContext("/dev/nvidia-uvm", in_container=True), ("nvidia-modprobe -u",)),
    (errno.ENXIO, OpenContext("/dev/nvidia0", module_loaded=False), ("module is not loaded",)),
    (errno.ENXIO, OpenContext("/dev/nvidia0"), ("driver reload",)),
])
def test_what_sits_between_tells_causes_apart(
        code: int, context: OpenContext, words: tuple[str, ...]) -> None:
    found = openerrors.explain(code, context)
    said = f"{found.cause} {found.fix}"
    assert all(w in said for w in words), said


def test_a_gpu_given_to_another_job_is_intended() -> None:
    for code in (errno.ENOENT, errno.EPERM, errno.EACCES):
        found = openerrors.explain(code, OpenContext(
            "/dev/nvidia3", given_elsewhere="SLURM_JOB_GPUS=0,1"))
        assert found.intended and "SLURM_JOB_GPUS=0,1" in found.cause


def test_cgroup_device_rules_are_read_as_the_kernel_reads_them() -> None:
    assert devopen.rules_allow(("c 195:* rwm",), 3)
    assert devopen.rules_allow(("a *:* rwm",), 3)
    assert not devopen.rules_allow(("c 195:0 rwm", "c 195:255 rwm"), 3)
    assert not devopen.rules_allow(("c 195:3 r",), 3)
    assert not devopen.rules_allow(("c 1:3 rwm",), 3)


def test_device_rules_and_identity_come_from_the_root(tmp_path: Path) -> None:
    root = build(tmp_path / "m", Machine(device_rules=("c 195:0 rwm",), uid=1234, library=None,
                                         groups=(44, 1234)))
    assert devopen.device_rules(root) == ("c 195:0 rwm",)
    who = devopen.identity(root)
    assert (who.uid, who.groups) == (1234, (44, 1234))


@pytest.fixture(scope="module")
def old_cpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A machine whose CPU lacks AVX and whose cgroup saw one OOM kill."""
    return build(tmp_path_factory.mktemp("m"), Machine(cpu_flags=("sse2",), oom_kills=1,
                                                       library=None))


@pytest.mark.parametrize("number", sorted({*signal.Signals, signal.SIGRTMIN + 3}))
def test_every_signal_has_a_meaning(number: int, old_cpu: Path) -> None:
    root = old_cpu
    text = signals.describe(-number, root)
    assert text is not None and text.startswith(f"killed by {signals.name(number)}: ")
    assert len(text) > len(f"killed by {signals.name(number)}: ") + 20
    if number in (signal.SIGCHLD, signal.SIGWINCH, signal.SIGURG, signal.SIGCONT):
        assert "cannot end a process" in text
    if number in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        assert "stops a process" in text


def test_signals_read_this_machine(tmp_path: Path) -> None:
    root = build(tmp_path / "m", Machine(oom_kills=0, library=None))
    assert "dmesg" in signals.meaning(signal.SIGKILL, root)
    assert "MiB" in signals.meaning(signal.SIGBUS, root) and "--shm-size" in \
        signals.meaning(signal.SIGBUS, root)
    assert "seccomp" in signals.meaning(signal.SIGSYS, root)
    assert signals.describe(0, root) is None and signals.describe(1, root) is None


@pytest.mark.parametrize(("driver", "kind"), [
    ("nvidia", "nvidia"), (None, "none"), ("nouveau", "nouveau"), ("vfio-pci", "passthrough"),
    ("vfio_pci", "passthrough"), ("nvgrace_gpu_vfio_pci", "passthrough"),
    ("pci-stub", "stub"), ("pciback", "stub"), ("xen-pciback", "stub"), ("amdgpu", "other"),
])
def test_every_bound_driver_falls_in_one_kind(driver: str | None, kind: str) -> None:
    meaning = pcibus.driver_meaning(driver, pcibus.PciGpu("0000:3b:00.0", "0x2330", driver))
    assert meaning.kind == kind and meaning.usable == (kind == "nvidia")
    assert kind == "nvidia" or (meaning.cause and meaning.fix)


@pytest.mark.parametrize(("environ", "in_container", "expected"), [
    ({"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1"}, False, [("SLURM_STEP_GPUS", ("1",))]),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, True, [("NVIDIA_VISIBLE_DEVICES", None)]),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, True, [("NVIDIA_VISIBLE_DEVICES", ())]),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, True, [("NVIDIA_VISIBLE_DEVICES", ())]),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, False, []),  # on a host nobody acted on it
    ({"CUDA_VISIBLE_DEVICES": "-1"}, False, [("CUDA_VISIBLE_DEVICES", ())]),
    ({"GPU_DEVICE_ORDINAL": "0,1"}, False, [("GPU_DEVICE_ORDINAL", ("0", "1"))]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-ab, 2"}, False, [("CUDA_VISIBLE_DEVICES", ("GPU-ab", "2"))]),
])
def test_assignments_are_read_from_every_source(
        environ: dict[str, str], in_container: bool,
        expected: list[tuple[str, tuple[str, ...] | None]]) -> None:
    found = assignment.read(environ, in_container=in_container)
    assert [(a.variable, a.ids) for a in found] == expected


def test_process_identity_defaults_to_this_process_without_a_status(tmp_path: Path) -> None:
    assert devopen.identity(tmp_path).uid == os.geteuid()
