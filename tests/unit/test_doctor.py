"""Every doctor check's ok / warn / error paths, with fake NVML and fake TensorFlow answers.

No GPU is needed: NVML is `tests/fake_nvml.py`, TensorFlow's answers are canned `TfFacts`.
"""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import SettingsErrors
from mgpu_env.doctor import checks, preflight
from mgpu_env.doctor.checks import Check, capability_support, run_checks
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware.nvml import Probed
from tests.support.fake_doctor import GIB, healthy_host, make_facts, tf_facts
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus, fake_with
from tests.support.fakelimits import probed_limits
from tests.support.runtimes import runtime_for

Install = Callable[[FakeNvml], FakeNvml]
MachineFacts = Callable[..., Facts]


def by_id(facts: Facts) -> dict[str, Check]:
    return {c.id: c for c in run_checks(facts)}


# ----------------------------------------------------------------------------- healthy


def test_two_healthy_gpus_everything_ok(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2, nvlink=True, driver_version="555.42.06", cuda_driver_version=12050))
    results = by_id(make_facts("all", tf=tf_facts(2)))
    bad = {k: (c.status, c.found) for k, c in results.items() if c.status in ("warn", "error")}
    assert bad == {}
    assert results["visible.tensorflow"].found.startswith("Num GPUs Available: 2")
    assert "NVLink" in results["gpu.topology"].found
    assert results["gpu.0"].status == "ok"


def test_every_check_has_found_and_every_problem_a_fix(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(8, driver_version="470.82.01", cuda_driver_version=11040,
                            p2p_ok=False, topology_level=50))
    host = healthy_host(euid=Probed(value=0), limits=probed_limits(
        shm_size=64 * 1024 * 1024, rlimits={"memlock": (65536, 65536)}))
    for check in run_checks(make_facts("all", tf=tf_facts(0, cudnn=None), host=host)):
        assert check.found, check
        if check.status in ("warn", "error"):
            assert check.fix, check


# ------------------------------------------------------------------------------ driver


def test_no_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from mgpu_env.hardware import nvml

    def missing() -> None:
        raise ImportError("no pynvml")

    monkeypatch.setattr(nvml, "load_library", missing)
    results = by_id(make_facts("all", host=healthy_host(in_container=Probed(value=False))))
    assert results["driver.nvml"].status == "warn"
    assert "could not collect" in results["driver.nvml"].found
    assert results["driver.version"].status == "skip"
    # One cause, one warning: the request line is a consequence of the driver line.
    assert results["visible.request"].status == "skip"
    assert "CPU" in results["visible.request"].found
    assert "Driver (NVML)" in results["visible.request"].found


@pytest.mark.parametrize(
    ("setting", "nvml_status", "request_status", "bad_setting"),
    [("all", "warn", "skip", False), ("0", "error", "error", True), ("none", "skip", "ok", False)],
)
def test_driver_not_loaded_by_request(machine_facts: MachineFacts,
    use_fake_nvml: Install, setting: str, nvml_status: str, request_status: str,
    bad_setting: bool,
) -> None:
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    results = by_id(machine_facts(setting))
    assert results["driver.nvml"].status == nvml_status
    assert results["visible.request"].status == request_status
    assert results["visible.request"].bad_setting is bad_setting


def test_in_container_without_gpus_names_the_toolkit(use_fake_nvml: Install) -> None:
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    host = healthy_host(device_files=Probed(value=()))
    results = by_id(make_facts("all", host=host))
    # No driver in a container: one warning (the driver line, with the container's fix);
    # the missing device files are the same cause, shown but not counted again.
    assert [c.id for c in results.values() if c.status == "warn"] == ["driver.nvml"]
    assert results["driver.device_files"].status == "skip"
    assert "Driver (NVML)" in results["driver.device_files"].found
    assert "--gpus all" in results["driver.nvml"].fix
    assert "NVIDIA Container Toolkit" in results["driver.nvml"].fix
    # With NVML working but no device files (an odd mount), the files are the finding.
    use_fake_nvml(fake_with(0))
    alone = by_id(make_facts("all", host=host))
    assert alone["driver.device_files"].status == "warn"
    assert "--gpus all" in alone["driver.device_files"].fix
    outside = by_id(make_facts("all", host=healthy_host(in_container=Probed(value=False))))
    assert outside["driver.device_files"].status == "skip"


@pytest.mark.parametrize(
    ("driver", "cuda", "version_status", "cuda_status"),
    [
        ("560.35.03", 12060, "ok", "ok"),
        ("555.42.06", 12050, "ok", "ok"),  # CUDA 12.5.1's minimum
        ("555.42.02", 12050, "warn", "ok"),  # 12.5 GA's driver: runs 12.5.1 by minor compat
        ("535.104.05", 12020, "warn", "ok"),  # minor-version compatibility: one warning
        ("525.60.13", 12000, "warn", "ok"),
        ("470.82.01", 11040, "error", "error"),  # too old for CUDA 12
    ],
)
def test_driver_against_the_table(machine_facts: MachineFacts,
    use_fake_nvml: Install, driver: str, cuda: int, version_status: str, cuda_status: str
) -> None:
    use_fake_nvml(fake_with(1, driver_version=driver, cuda_driver_version=cuda))
    results = by_id(machine_facts("all", tf=tf_facts(1)))
    assert results["driver.version"].status == version_status
    assert results["driver.cuda"].status == cuda_status
    if version_status != "ok":
        assert "555.42.06" in results["driver.version"].fix
        assert "525.60.13" in results["driver.version"].expected


def test_driver_queries_not_supported(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1, unsupported={"nvmlSystemGetDriverVersion",
                                            "nvmlSystemGetCudaDriverVersion_v2"}))
    results = by_id(machine_facts("all"))
    assert results["driver.version"].status == "warn"
    assert "could not collect" in results["driver.version"].found
    assert results["driver.cuda"].status == "warn"


# -------------------------------------------------------------------------- TensorFlow


def test_cpu_only_tensorflow_with_gpus_is_an_error(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    results = by_id(machine_facts("all", tf=tf_facts(0, cuda_build=False)))
    assert results["tensorflow.build"].status == "error"
    assert "tensorflow[and-cuda]" in results["tensorflow.build"].fix
    assert results["visible.tensorflow"].status == "error"
    assert "CPU-only" in results["visible.tensorflow"].fix


def test_cpu_only_tensorflow_without_gpus_is_fine(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    results = by_id(machine_facts("all", tf=tf_facts(0, cuda_build=False)))
    assert results["tensorflow.build"].status == "ok"
    # A cuDNN that is there is reported as found, not skipped; no GPU will use it.
    assert results["tensorflow.cudnn"].status == "ok"
    assert "9.3.0" in results["tensorflow.cudnn"].found
    assert "unused here" in results["tensorflow.cudnn"].found
    assert results["visible.tensorflow"].status == "ok"


def test_cudnn_without_a_gpu(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    missing = by_id(machine_facts("all", tf=tf_facts(0, cudnn=None)))["tensorflow.cudnn"]
    assert missing.status == "skip" and missing.skipped_for is not None
    old = by_id(machine_facts("all", tf=tf_facts(0, cudnn="8.9.7")))["tensorflow.cudnn"]
    # A version TensorFlow would refuse is named even here, on a row of its own.
    assert old.status == "skip" and "another major version" in old.found
    assert old.skipped_for is None


def test_tensorflow_does_not_import(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    from mgpu_env.tfprobes import tfprobe

    use_fake_nvml(fake_with(1))
    results = by_id(machine_facts("all", tf=tfprobe.failed("TensorFlow does not import: boom")))
    assert results["tensorflow.build"].status == "error"
    assert results["visible.tensorflow"].status == "error"


def test_build_cuda_disagrees_with_table(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    tf = tf_facts(1)
    info = tf.build.value
    assert info is not None
    odd = type(tf)(version=tf.version, gpus=tf.gpus, cudnn=tf.cudnn,
                   build=Probed(value=type(info)(True, "12.3.2", "8", info.compute_capabilities)))
    assert by_id(machine_facts("all", tf=odd))["tensorflow.build"].status == "warn"


@pytest.mark.parametrize(
    ("cudnn", "status"),
    [("9.3.0", "ok"), ("9.3.1", "ok"), ("9.8.0", "ok"), ("9.1.1", "error"), ("8.9.7", "error"),
     (None, "error")],
)
def test_cudnn(
        machine_facts: MachineFacts, use_fake_nvml: Install, cudnn: str | None,
        status: str) -> None:
    use_fake_nvml(fake_with(1))
    results = by_id(machine_facts("all", tf=tf_facts(1, cudnn=cudnn)))
    assert results["tensorflow.cudnn"].status == status


def test_cudnn_not_judged_without_gpus(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    check = by_id(machine_facts("all", tf=tf_facts(0, cudnn=None)))["tensorflow.cudnn"]
    assert check.status == "skip"
    assert "could not collect" in check.found


def test_no_tf_skips_the_tensorflow_checks(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    results = by_id(machine_facts("all"))
    for key in ("tensorflow.build", "tensorflow.cudnn", "visible.tensorflow"):
        assert results[key].status == "skip"
        assert "--no-tf" in results[key].found


# ------------------------------------------------------------------------------- GPUs


@pytest.mark.parametrize(
    ("capability", "support"),
    [((8, 0), "native"), ((8, 6), "native"), ((8, 9), "native"), ((7, 5), "native"),
     ((9, 0), "ptx"), ((10, 0), "ptx"), ((12, 0), "ptx"), ((5, 2), "none"), ((3, 7), "none")],
)
def test_capability_support(capability: tuple[int, int], support: str) -> None:
    from tests.support.fake_doctor import TF_221_CAPABILITIES

    assert capability_support(capability, TF_221_CAPABILITIES) == support


def test_arch_specific_machine_code_runs_on_that_gpu_only() -> None:
    assert capability_support((9, 0), ["sm_90a"]) == "native"
    assert capability_support((10, 0), ["sm_90a"]) == "none"
    assert capability_support((10, 0), ["sm_100"]) == "native"


def test_mixed_compute_capabilities(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([
        FakeGpu(name="NVIDIA A100", compute_capability=(8, 0)),
        FakeGpu(name="Tesla M60", compute_capability=(5, 2)),
        FakeGpu(name="NVIDIA B200", compute_capability=(10, 0)),
    ]))
    results = by_id(machine_facts("all", tf=tf_facts(3), mixed_precision="fp16"))
    assert results["gpu.0"].status == "ok"
    assert results["gpu.1"].status == "error"
    assert "no code for compute capability 5.2" in results["gpu.1"].fix
    # Blackwell: TensorFlow 2.21's PTX does not run there (tensorflow#97387, #99592).
    assert results["gpu.2"].status == "error" and "CUDA_ERROR_INVALID_PTX" in results["gpu.2"].fix
    assert results["gpu.uniform"].status == "warn"
    assert results["gpu.mixed_precision"].status == "warn"
    assert "GPU 1: no FP16" in results["gpu.mixed_precision"].fix
    # The old GPU left out of GPUS stops nothing.
    chosen = by_id(machine_facts("0,2", tf=tf_facts(2)))
    assert chosen["gpu.1"].status == "ok" and "not used" in chosen["gpu.1"].found


@pytest.mark.parametrize(
    ("capability", "mode", "status"),
    [((7, 0), "fp16", "ok"), ((7, 0), "bf16", "error"), ((8, 0), "bf16", "ok"),
     ((6, 1), "1", "warn"), ((6, 1), "0", "ok"), ((8, 0), "1", "ok")],
)
def test_mixed_precision_fitness(machine_facts: MachineFacts,
    use_fake_nvml: Install, capability: tuple[int, int], mode: str, status: str
) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(compute_capability=capability)]))
    check = by_id(machine_facts("all", mixed_precision=mode))["gpu.mixed_precision"]
    assert check.status == status


def test_fp16_on_cpu_warns(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    precision = by_id(machine_facts("all", mixed_precision="fp16"))["gpu.mixed_precision"]
    assert precision.status == "warn"
    assert by_id(machine_facts("all", mixed_precision="bf16"))["gpu.mixed_precision"].status == "ok"


def test_mig_on(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(mig=True), FakeGpu()]))
    results = by_id(machine_facts("all", tf=tf_facts(2)))
    assert results["gpu.0"].status == "warn"
    assert "MIG on" in results["gpu.0"].found
    assert "-mig 0" in results["gpu.0"].fix
    assert results["gpu.1"].status == "ok"


def test_gpu_queries_not_supported_never_crash(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2, unsupported={
        "nvmlDeviceGetMigMode", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetP2PStatus",
    }))
    results = by_id(machine_facts("all", tf=tf_facts(2)))
    gpu = results["gpu.0"]
    assert gpu.status == "warn"
    assert "no MIG" in gpu.found  # "Not Supported" for MIG means the board has none
    assert "compute capability could not collect" in gpu.found
    assert results["gpu.topology"].status == "warn"
    assert "topo -m" in results["gpu.topology"].fix


def test_busy_gpu(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(memory_free=2 * GIB)]))
    check = by_id(machine_facts("all"))["gpu.0"]
    assert check.status == "warn" and "nvidia-smi" in check.fix


# --------------------------------------------------------------------------- topology


def test_topology_across_sockets_names_nccl_settings(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(4, nvlink=True, links={
        (0, 2): (50, False, False), (0, 3): (50, False, False),
        (1, 2): (50, False, False), (1, 3): (50, False, False),
    }))
    check = by_id(machine_facts("all"))["gpu.topology"]
    assert check.status == "warn"
    assert "0-2: across CPU sockets, no P2P" in check.found
    for name in ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_DEBUG"):
        assert name in check.fix
    assert by_id(machine_facts("0,1"))["gpu.topology"].status == "ok"


def test_topology_pcie_switch_with_p2p_is_ok(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2, topology_level=10, p2p_ok=True))
    check = by_id(machine_facts("all"))["gpu.topology"]
    assert check.status == "ok"
    assert "single PCIe switch, P2P" in check.found


def test_topology_skipped_for_one_gpu(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(8))
    assert by_id(machine_facts("3"))["gpu.topology"].status == "skip"


# -------------------------------------------------------------------- visible devices


def test_bad_index_is_a_bad_setting(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    check = by_id(machine_facts("5", tf=tf_facts(2)))["visible.request"]
    assert check.status == "error" and check.bad_setting
    assert "there is no GPU 5" in check.found
    assert "0..1" in check.expected


def test_gpus_zero_with_no_gpu(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    check = by_id(machine_facts("0"))["visible.request"]
    assert check.status == "error" and check.bad_setting


def test_tensorflow_sees_fewer_gpus_than_asked(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    check = by_id(machine_facts("all", tf=tf_facts(1)))["visible.tensorflow"]
    assert check.status == "error"
    assert "TensorFlow lists 1 GPU(s)" in check.found
    assert "asks for 2" in check.found
    assert "CUDA_VISIBLE_DEVICES=0,1" in check.found


def test_selection_reaches_tensorflow(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(4))
    seen: dict[str, str] = {}

    def collect(env: dict[str, str]) -> object:
        seen.update(env)
        return tf_facts(2)

    from mgpu_env.doctor import gather
    from mgpu_env.doctor.diagnosis import ChildProbes

    # GPUS selects within what the job was given, by position (issue 41: never wider).
    facts = gather(resolve_settings({"GPUS": "1,3"}, {}), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                   children=ChildProbes(tensorflow=collect))  # type: ignore[arg-type]
    assert seen["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert facts.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # the user's value is reported
    assert by_id(facts)["visible.tensorflow"].status == "ok"


def test_preset_cuda_visible_devices_with_gpus_all(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(4))
    facts = machine_facts("all", tf=tf_facts(2), environ={"CUDA_VISIBLE_DEVICES": "2,3"})
    results = by_id(facts)
    assert results["visible.tensorflow"].status == "ok"
    assert "CUDA_VISIBLE_DEVICES='2,3'" in results["visible.environment"].found
    hidden = by_id(machine_facts("all", tf=tf_facts(0), environ={"CUDA_VISIBLE_DEVICES": "-1"}))
    assert hidden["visible.environment"].status == "warn"
    assert hidden["visible.tensorflow"].status == "ok"


def test_nvidia_visible_devices_void(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    facts = machine_facts("all", environ={"NVIDIA_VISIBLE_DEVICES": "void"})
    assert by_id(facts)["visible.environment"].status == "warn"


# -------------------------------------------------------------------------- container


def test_root(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    check = by_id(make_facts("all", host=healthy_host(euid=Probed(value=0))))["container.user"]
    assert check.status == "warn" and "HOST_UID=$(id -u)" in check.fix


# --------------------------------------------------------------------------- versions


def test_python_outside_the_range(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    check = by_id(make_facts("all", python="3.9.18"))["versions"]
    assert check.status == "error" and "3.10-3.13" in check.fix
    assert by_id(make_facts("all"))["versions"].status == "ok"


def test_broken_check_becomes_a_warning(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))

    def broken(facts: Facts) -> Check:
        raise RuntimeError("boom")

    (result,) = run_checks(machine_facts("all"), [broken])
    assert result.status == "warn" and "could not collect" in result.found


# -------------------------------------------------------------------------- preflight


def test_preflight_none_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from mgpu_env.hardware import nvml

    def refuse() -> None:
        raise AssertionError("NVML must not be asked for GPUS=none")

    monkeypatch.setattr(nvml, "load_library", refuse)
    assert preflight(runtime_for("none", {})) == []


def test_preflight_no_gpu_does_not_import_tensorflow(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.tfprobes import tfprobe

    use_fake_nvml(fake_with(0))
    monkeypatch.setattr(tfprobe, "collect_in_process", lambda: pytest.fail("imported TF"))
    assert preflight(runtime_for("all", {})) == []
    (cpu_fallback,) = preflight(runtime_for("all", {}), strict=True)
    assert cpu_fallback.id == "visible.request" and cpu_fallback.status == "warn"


def test_preflight_reports_what_stops_training(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2, driver_version="470.82.01", cuda_driver_version=11040))
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    failing = preflight(runtime_for("0,1", env), tensorflow=tf_facts(0, cudnn=None))
    ids = {c.id for c in failing}
    assert {"driver.version", "driver.cuda", "tensorflow.cudnn", "visible.tensorflow"} <= ids
    assert all(c.status == "error" and c.fix for c in failing)


def test_preflight_healthy(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert preflight(runtime_for("all", env), tensorflow=tf_facts(2)) == []
    assert preflight(runtime_for("1", {"CUDA_VISIBLE_DEVICES": "1"}),
                     tensorflow=tf_facts(1)) == []


def test_preflight_bad_index(use_fake_nvml: Install) -> None:
    # The runtime refuses a GPU the machine lacks before any check runs (exit 2).
    use_fake_nvml(fake_with(1))
    with pytest.raises(SettingsErrors) as caught:
        runtime_for("3", {})
    assert "GPUS='3'" in str(caught.value) and caught.value.exit_code == 2


def test_all_check_ids_are_unique(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(3))
    ids = [c.id for c in run_checks(machine_facts("all", tf=tf_facts(3)))]
    assert len(ids) == len(set(ids))
    assert len(checks.ALL_CHECKS) >= 15



@pytest.mark.parametrize("nvml_fake", [
    fake_with(0),  # the toolkit is there, but the machine has no GPU
    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),  # no driver in the container
])
def test_the_gpu_compose_file_without_gpus_says_what_to_set(
    use_fake_nvml: Install, nvml_fake: FakeNvml
) -> None:
    use_fake_nvml(nvml_fake)
    nvml = by_id(make_facts("all", environ={"MGPU_COMPOSE_GPU": "1"}))["driver.nvml"]
    assert nvml.status == "warn"
    assert "docker-compose.gpu.yml" in nvml.found
    assert "COMPOSE_FILE=docker-compose.yml" in nvml.fix
    assert "NVIDIA Container Toolkit" in nvml.fix


def test_without_the_gpu_compose_file_no_gpu_is_fine(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    nvml = by_id(machine_facts("all"))["driver.nvml"]
    assert nvml.status == "ok" and "compose" not in nvml.found + nvml.fix


def test_the_gpu_compose_file_sets_its_marker() -> None:
    from tests.support.children import REPO

    gpu_file = (REPO / "docker-compose.gpu.yml").read_text()
    assert "MGPU_COMPOSE_GPU=1" in gpu_file
