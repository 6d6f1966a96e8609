"""The chain from the PCI bus to NVML on fake machines: files under MGPU_HOST_ROOT (character
devices made with mknod where allowed), the fake NVML answering as the machine does, and a
gcc-built libcuda.so.1 that the real CUDA driver probe loads. No doctor function is replaced;
the `fake_machine` fixture fails a test whose probes read the real /proc, /sys, /dev or /etc."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Check, Diagnosis, diagnose
from mgpu_env.doctor.chain import build
from tests.support import hostaudit
from tests.support.fake_nvml import FakeNvml
from tests.support.fakemachine import FakeHost, Machine, bus_ids, machine_nvml, mknod_allowed

MakeMachine = Callable[..., FakeHost]
FOUR = bus_ids(4)


def doctor(host: FakeHost, settings: dict[str, str] | None = None,
           environ: dict[str, str] | None = None) -> Diagnosis:
    env = {**host.environ, **(environ or {})}
    return diagnose(resolve_settings({"GPUS": "all", **(settings or {})}, env), env,
                    with_tensorflow=False)


def chain_lines(report: Diagnosis) -> dict[str, Check]:
    return {c.id: c for c in report.checks if c.id == "chain" or c.id.startswith("chain.")}


def assert_quiet(report: Diagnosis, count: int) -> None:
    lines = chain_lines(report)
    assert list(lines) == ["chain"], lines
    assert lines["chain"].status == "ok", lines["chain"]
    assert lines["chain"].found.startswith(
        f"PCI bus {count} -> kernel driver {count} -> nvidia module {count} -> device files "
        f"{count} -> user-space driver {count} -> NVML {count}"), lines["chain"].found
    assert not report.errors, report.errors
    # Quiet means no warning either: the limits and /dev/shm of a healthy machine read as such.
    assert not report.warnings, report.warnings


# ------------------------------------------------------------------ a healthy machine: quiet


def test_healthy_8_gpu_nvswitch_host_is_quiet(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=bus_ids(8))
    host = fake_machine(machine, nvml=machine_nvml(machine, p2p_ok=True))
    report = doctor(host)
    assert_quiet(report, 8)
    assert "this job 8 -> GPUS 8 -> CUDA 8" in chain_lines(report)["chain"].found


def test_healthy_pcie_workstation_is_quiet(fake_machine: MakeMachine) -> None:
    # Two VGA-class cards (0x0300): one drives the display. Their HDMI audio functions are
    # NVIDIA's too (class 0x0403) and are not GPUs.
    host = fake_machine(Machine(gpus=("0000:01:00.0", "0000:02:00.0"),
                                device_class="0x030000"))
    assert_quiet(doctor(host), 2)


def test_documented_container_is_quiet(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=bus_ids(4), container=True))
    report = doctor(host, environ={"NVIDIA_VISIBLE_DEVICES": "all", "MGPU_COMPOSE_GPU": "1"})
    assert_quiet(report, 4)


def test_container_given_two_of_eight_is_quiet_and_says_so(fake_machine: MakeMachine) -> None:
    # The toolkit empties the /proc folders of the GPUs it did not give and adds only the
    # given device files; /sys still shows all eight.
    eight = bus_ids(8)
    machine = Machine(gpus=eight, container=True, hidden=eight[2:],
                      missing=tuple(f"nvidia{n}" for n in range(2, 8)))
    report = doctor(fake_machine(machine), environ={"NVIDIA_VISIBLE_DEVICES": "0,1"})
    line = chain_lines(report)["chain"]
    assert line.status == "ok" and list(chain_lines(report)) == ["chain"]
    assert "nvidia module 2" in line.found and "6 hidden from this container" in line.found


def test_the_audit_catches_a_probe_that_reads_the_real_machine(
        fake_machine: MakeMachine) -> None:
    fake_machine(Machine())
    Path("/proc/self/status").read_text()  # what a probe that ignores MGPU_HOST_ROOT does
    reads = hostaudit.stop()
    assert reads == ["open /proc/self/status"]


# -------------------------------------------- kernel driver: every bound driver's kind


@pytest.mark.parametrize(("driver", "words"), [
    (None, ("no kernel driver is bound", "sudo modprobe nvidia", "dmesg | grep NVRM")),
    ("nouveau", ("nouveau", "blacklist nouveau")),
    ("vfio-pci", ("vfio-pci holds it", "virtual machine", "vfio-pci.ids=", "10de:2330",
                  "/sys/bus/pci/devices/<bus id>/driver/unbind")),
    ("nvgrace_gpu_vfio_pci", ("virtual machine", "vfio-pci.ids=")),
    ("pci-stub", ("pci-stub holds it", "pci-stub.ids=")),
    ("xen-pciback", ("xen-pciback holds it", "passthrough")),
    ("i915", ("'i915' holds it, not NVIDIA's", "unbind")),
])
def test_a_gpu_held_by_another_driver_is_named(
        fake_machine: MakeMachine, driver: str | None, words: tuple[str, ...]) -> None:
    host = fake_machine(Machine(gpus=FOUR, drivers={FOUR[2]: driver}))
    lines = chain_lines(doctor(host))
    lost = lines["chain.kernel-driver"]
    assert lost.status == "error" and lost.found.startswith(FOUR[2]), lost
    said = f"{lost.found} {lost.fix}"
    assert all(word in said for word in words), said
    assert "kernel driver 3 -> nvidia module 3" in lines["chain"].found


def test_four_gpus_on_the_bus_and_none_in_nvml_is_not_ready(fake_machine: MakeMachine) -> None:
    # A host that reserved every GPU for virtual machines: NVML starts and lists none.
    machine = Machine(gpus=FOUR, drivers=dict.fromkeys(FOUR, "vfio-pci"))
    report = doctor(fake_machine(machine))
    lost = chain_lines(report)["chain.kernel-driver"]
    assert lost.status == "error" and all(bus in lost.found for bus in FOUR)
    assert report.verdict().startswith("not ready")
    nvml = next(c for c in report.checks if c.id == "driver.nvml")
    assert nvml.status == "error" and "the kernel shows 4 NVIDIA GPU(s)" in nvml.found


# --------------------------------------------------------------- the module and its build


def test_open_module_that_leaves_a_gpu_out_names_the_flavour(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, flavour="open", attached=FOUR[:3])
    lost = chain_lines(doctor(fake_machine(machine)))["chain.nvidia-module"]
    assert FOUR[3] in lost.found and "Turing" in lost.found and "proprietary" in lost.fix


def test_an_unexplained_drop_says_between_which_layers(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, attached=FOUR[:3])
    lost = chain_lines(doctor(fake_machine(machine)))["chain.nvidia-module"]
    assert lost.status == "error"
    assert "dropped between kernel driver and nvidia module; facts: nvidia 555.42.06 " \
           "(proprietary kernel module)" in lost.found


def test_library_of_another_driver_version_drops_every_gpu(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, library="550.54.15")
    lost = chain_lines(doctor(fake_machine(machine)))["chain.user-space-driver"]
    assert "libnvidia-ml is 550.54.15, the kernel module 555.42.06" in lost.found
    assert "reboot" in lost.fix


def test_nvml_losing_a_gpu_names_nvml_s_error(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR)
    nvml = machine_nvml(machine, handle_errors={1: 15})  # GPU_IS_LOST
    report = doctor(fake_machine(machine, nvml=nvml))
    # NVML's own line names it (one cause, one error); the chain counts it and points there.
    assert "1 lost at NVML: see the Driver (NVML) line" in chain_lines(report)["chain"].found
    nvml_line = next(c for c in report.checks if c.id == "driver.nvml")
    assert nvml_line.status == "error" and FOUR[1] in nvml_line.found
    layer = build(report.facts).layer("NVML")
    assert layer is not None and layer.drops[0].gpus == (FOUR[1],)
    assert layer.drops[0].cause.startswith("NVML cannot use it")


# ------------------------------------------------------- device files: errnos, for real


def test_missing_device_file_on_a_host(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, missing=("nvidia1",))
    lost = chain_lines(doctor(fake_machine(machine)))["chain.device-files"]
    assert lost.found.startswith(FOUR[1]) and "ENOENT" in lost.found
    assert "nvidia-modprobe" in lost.fix


def test_missing_uvm_file_drops_every_gpu_for_cuda(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, missing=("nvidia-uvm",))
    lost = chain_lines(doctor(fake_machine(machine)))["chain.device-files"]
    assert all(bus in lost.found for bus in FOUR) and "CUDA needs it" in lost.found
    assert "nvidia-modprobe -u -c=0" in lost.fix


def test_device_file_with_no_driver_behind_it(fake_machine: MakeMachine, tmp_path: Path) -> None:
    if not mknod_allowed(tmp_path):
        pytest.skip("mknod is not allowed here (not root): a dead character device needs it")
    machine = Machine(gpus=FOUR, dead=(2,))
    lost = chain_lines(doctor(fake_machine(machine)))["chain.device-files"]
    assert lost.found.startswith(FOUR[2]) and "ENXIO" in lost.found
    assert "no driver answers behind it" in lost.found


def test_device_file_the_user_may_not_open(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, device_mode=0o660, device_gid=44, groups=(1000,))
    lost = chain_lines(doctor(fake_machine(machine)))["chain.device-files"]
    assert "EACCES" in lost.found and "crw-rw---- group video" in lost.found
    assert "usermod -aG video" in lost.fix


def test_device_file_that_is_a_folder(fake_machine: MakeMachine) -> None:
    machine = Machine(gpus=FOUR, folders=("nvidia3",), container=True)
    lost = chain_lines(doctor(fake_machine(machine)))["chain.device-files"]
    assert "EISDIR" in lost.found and "--gpus" in lost.fix


def test_device_files_as_regular_files_serve_where_mknod_is_refused(
        fake_machine: MakeMachine) -> None:
    assert_quiet(doctor(fake_machine(Machine(gpus=FOUR, devices="file"))), 4)


def test_unknown_nvml_without_any_layer_below_is_not_invented(
        fake_machine: MakeMachine) -> None:
    # A machine whose /sys shows no NVIDIA function (WSL2): NVML's GPUs are not a drop.
    machine = Machine(gpus=(), kernel=None)
    report = doctor(fake_machine(machine, nvml=FakeNvml(gpus=machine_nvml(
        Machine(gpus=bus_ids(1))).gpus), libcuda={"device_count": 1}))
    lines = chain_lines(report)
    assert list(lines) == ["chain"] and lines["chain"].status == "ok"
    assert "not read here: PCI bus" in lines["chain"].found


@pytest.mark.parametrize("value", ["relative/root", "/no/such/folder"])
def test_a_bad_host_root_is_a_bad_setting(value: str) -> None:
    result = CliRunner().invoke(app, ["doctor", "--no-tf"], env={"MGPU_HOST_ROOT": value})
    assert result.exit_code == 2, result.output
    assert f"MGPU_HOST_ROOT={value!r} is not an absolute path" in result.stderr
    assert "Traceback" not in result.output
