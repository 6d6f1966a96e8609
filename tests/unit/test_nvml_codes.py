"""The model of NVML's return codes, walked for every `NVML_ERROR_*` the installed
nvidia-ml-py defines: at nvmlInit, for one GPU's handle, and for one field. No code falls to
a generic answer; a GPU machine whose NVML fails is never judged "CPU only"; the facts that
tell the causes apart (a fake /proc, /sys and /dev, a gcc-built libnvidia-ml.so) decide
the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from mgpu_env.config.errors import RunFailed
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor import require_ready
from mgpu_env.doctor.checks import check_nvml, run_checks
from mgpu_env.doctor.checks.nvmlcause import FIX_CAPABILITIES, FIX_MODULE_NOT_LOADED, FIX_NOUVEAU
from mgpu_env.hardware import nvidiahost, nvml, nvmlerrors
from mgpu_env.hardware.nvml import Probed
from tests.support.fake_doctor import healthy_host, make_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakemachine import BUS_IDS, machine_root
from tests.support.runtimes import runtime_for

Install = Callable[[FakeNvml], FakeNvml]
CODES = {name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith("NVML_ERROR_")}
GENERIC = "NVML failed with return code"


def _host(root: Path, *, in_container: bool = False, uid: int = 1000) -> object:
    host = nvidiahost.collect(root, uid=uid, gids=(1000,))
    files = tuple(f.name for f in host.device_files.value or ())
    return healthy_host(in_container=Probed(value=in_container), nvidia=host,
                        device_files=Probed(value=files),
                        host_gpus=Probed(value=len(host.gpu_bus_ids)))


def test_the_table_holds_every_code_nvidia_ml_py_defines() -> None:
    assert len(CODES) >= 30
    for name, code in CODES.items():
        assert nvmlerrors.ERRORS[code].name == name, name
        assert nvmlerrors.ERRORS[code].cause and nvmlerrors.ERRORS[code].fix, name
    assert nvmlerrors.describe(12345).name == "nvmlReturn 12345"


@pytest.mark.parametrize("name", sorted(CODES))
def test_every_code_at_init_on_a_gpu_machine_is_an_error_with_its_cause(
    name: str, use_fake_nvml: Install, tmp_path: Path,
) -> None:
    use_fake_nvml(FakeNvml(init_error=CODES[name]))
    root = machine_root(tmp_path, gpus=BUS_IDS[:2])
    check = check_nvml(make_facts("all", host=_host(root)))  # type: ignore[arg-type]
    assert check.status == "error", check
    assert "2 NVIDIA GPU(s) on this machine (0000:18:00.0, 0000:3b:00.0) and none usable" \
        in check.found
    assert GENERIC not in check.found and "cause: " in check.found
    assert check.fix


@pytest.mark.parametrize("name", sorted(CODES))
def test_every_code_for_one_gpus_handle_names_it_and_keeps_the_others(
    name: str, use_fake_nvml: Install, tmp_path: Path,
) -> None:
    use_fake_nvml(fake_with(4, handle_errors={2: CODES[name]}))
    root = machine_root(tmp_path, gpus=BUS_IDS)
    facts = make_facts("all", host=_host(root))  # type: ignore[arg-type]
    assert [g.index for g in facts.gpus] == [0, 1, 3]
    check = check_nvml(facts)
    assert check.status == "error"
    assert f"GPU 2 (0000:86:00.0): {name}" in check.found
    assert "GPUS=0,1,3 trains on the healthy ones" in check.fix
    kept = check_nvml(make_facts("0,1,3", host=_host(root)))  # type: ignore[arg-type]
    assert kept.status == "warn" and "GPU 2" in kept.found


@pytest.mark.parametrize("name", sorted(CODES))
def test_every_code_for_one_field_is_could_not_collect_or_a_failed_gpu(
    name: str, use_fake_nvml: Install,
) -> None:
    code = CODES[name]
    use_fake_nvml(fake_with(2, errors={"nvmlDeviceGetMemoryInfo": code}))
    listing = nvml.snapshot().listing
    if nvmlerrors.describe(code).scope == "query":
        assert len(listing.gpus) == 2 and not listing.failed
        memory = listing.gpus[0].memory_total_mib
        assert memory.code == code and memory.text().startswith("could not collect")
    else:
        assert not listing.gpus
        assert [(f.index, f.code, f.bus_id) for f in listing.failed] == [
            (0, code, "00000000:10:00.0"), (1, code, "00000000:11:00.0")]


def _judged(code: int, root: Path, use_fake_nvml: Install, **host: object) -> object:
    use_fake_nvml(FakeNvml(init_error=code))
    return check_nvml(make_facts("all", host=_host(root, **host)))  # type: ignore[arg-type]


def test_driver_upgraded_without_a_reboot(use_fake_nvml: Install, tmp_path: Path) -> None:
    root = machine_root(tmp_path, kernel="550.54.15", library="550.90.07")
    check = _judged(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, root, use_fake_nvml)
    assert "kernel module is 550.54.15" in check.found  # type: ignore[attr-defined]
    assert "libnvidia-ml.so.550.90.07" in check.found  # type: ignore[attr-defined]
    assert "without a reboot" in check.found  # type: ignore[attr-defined]
    assert check.fix.startswith("reboot")  # type: ignore[attr-defined]


def test_an_image_with_driver_libraries_of_its_own(use_fake_nvml: Install, tmp_path: Path) -> None:
    root = machine_root(tmp_path, kernel="550.54.15", library="535.183.01")
    check = _judged(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, root, use_fake_nvml,
                    in_container=True)
    assert "the image ships driver libraries of its own" in check.found  # type: ignore[attr-defined]
    assert "mounts the host's 550.54.15 ones" in check.fix  # type: ignore[attr-defined]


def test_nouveau_holds_the_gpus(use_fake_nvml: Install, tmp_path: Path) -> None:
    root = machine_root(tmp_path, kernel=None, library=None, modules=("nouveau", "drm"))
    check = _judged(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, root, use_fake_nvml)
    assert check.status == "error" and check.fix == FIX_NOUVEAU  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_LIBRARY_NOT_FOUND])
def test_module_not_loaded_secure_boot(use_fake_nvml: Install, tmp_path: Path, code: int) -> None:
    root = machine_root(tmp_path, kernel=None, library=None, modules=())
    check = _judged(code, root, use_fake_nvml)
    assert "nvidia kernel module is not loaded" in check.found  # type: ignore[attr-defined]
    assert check.fix == FIX_MODULE_NOT_LOADED  # type: ignore[attr-defined]


def test_no_permission_on_the_device_files(use_fake_nvml: Install, tmp_path: Path) -> None:
    root = machine_root(tmp_path, device_mode=0o660, device_gid=44)
    check = _judged(pynvml.NVML_ERROR_NO_PERMISSION, root, use_fake_nvml)
    group = "video"  # the tree's /etc/group names gid 44
    assert "/dev/nvidiactl (crw-rw----" not in check.found  # type: ignore[attr-defined]
    assert f"/dev/nvidiactl (-rw-rw---- group {group})" in check.found  # type: ignore[attr-defined]
    assert f"sudo usermod -aG {group} $USER" in check.fix  # type: ignore[attr-defined]
    root_user = _judged(pynvml.NVML_ERROR_NO_PERMISSION, root, use_fake_nvml, uid=0)
    assert "cannot open" not in root_user.found  # type: ignore[attr-defined]


def test_module_without_its_libraries(use_fake_nvml: Install, tmp_path: Path) -> None:
    root = machine_root(tmp_path, library=None)
    check = _judged(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, root, use_fake_nvml)
    assert "module 550.54.15 is loaded, but not its libnvidia-ml.so.1" in check.found  # type: ignore[attr-defined]
    assert "nvidia-utils-550" in check.fix  # type: ignore[attr-defined]


def test_container_without_the_utility_capability(
    use_fake_nvml: Install, tmp_path: Path,
) -> None:
    root = machine_root(tmp_path, library=None)
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    facts = make_facts("all", host=_host(root, in_container=True),  # type: ignore[arg-type]
                       environ={"NVIDIA_DRIVER_CAPABILITIES": "compute"})
    assert check_nvml(facts).fix == FIX_CAPABILITIES


def test_a_cpu_machine_stays_a_warning(use_fake_nvml: Install, tmp_path: Path) -> None:
    root = machine_root(tmp_path, gpus=(), kernel=None, library=None, modules=())
    check = _judged(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, root, use_fake_nvml)
    assert check.status == "warn"  # type: ignore[attr-defined]
    assert "GPUS=all: training will use the CPU" in check.found  # type: ignore[attr-defined]


def test_training_stops_on_a_gpu_machine_without_nvml(
    use_fake_nvml: Install, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = machine_root(tmp_path, kernel="550.54.15", library="550.90.07")
    monkeypatch.setattr(probes, "probe_nvidia_host", lambda: nvidiahost.collect(root))
    monkeypatch.setattr(probes, "probe_in_container", lambda: Probed(value=False))
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    with pytest.raises(RunFailed, match="none usable") as stopped:
        require_ready(runtime_for("all", {}), wait_for_peers=False)
    assert "without a reboot" in str(stopped.value)
    require_ready(runtime_for("none", {}), wait_for_peers=False)  # the CPU on purpose


def test_a_failing_check_list_is_judged_once(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_GPU_IS_LOST))
    # The driver's libcuda.so (the suite's canned one) is 555.42.06: so is the module here.
    root = machine_root(tmp_path, kernel="555.42.06", library="555.42.06")
    checks = run_checks(make_facts("all", host=_host(root)))  # type: ignore[arg-type]
    assert [c.id for c in checks if c.status == "error"] == ["driver.nvml"]
