"""The doctor's CUDA-stack checks (libraries, NCCL, ptxas, libdevice), the container limits,
WSL2, sm_90, and mixed precision judged by training's own rule. Fake NVML, canned stacks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.doctor import preflight
from mgpu_env.doctor.checks import Check, run_checks
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import cudalibs
from mgpu_env.hardware.nvml import Probed
from mgpu_env.runtime.precision import choose_precision
from tests.support.fake_doctor import cuda_stack, healthy_host, make_facts, tf_facts
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus, fake_with
from tests.support.runtimes import runtime_for

Install = Callable[[FakeNvml], FakeNvml]
MachineFacts = Callable[..., Facts]
REAL_COLLECT = cudalibs.collect


def by_id(facts: Facts) -> dict[str, Check]:
    return {c.id: c for c in run_checks(facts)}


# ---------------------------------------------------------------------------- libraries


def test_healthy_stack_is_ok(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    results = by_id(machine_facts("all", tf=tf_facts(2), xla=True))
    for key in ("cuda.libraries", "cuda.nccl", "cuda.ptxas", "cuda.libdevice"):
        assert results[key].status == "ok", results[key]
    assert "10 of 10 load" in results["cuda.libraries"].found
    assert "cudnn 9.3.0" in results["cuda.libraries"].found
    assert results["cuda.nccl"].found.startswith("NCCL 2.27.7 (")
    assert results["cuda.ptxas"].found.startswith("12.5.82 (")


def test_json_carries_the_stack(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    from mgpu_env.doctor import Diagnosis

    use_fake_nvml(fake_with(1))
    facts = machine_facts("all", tf=tf_facts(1), cuda=cuda_stack(missing=("nccl",)))
    data = Diagnosis(tuple(run_checks(facts)), facts).to_dict()
    libraries = data["facts"]["cuda"]["libraries"]
    assert libraries["cudnn"]["value"]["version"] == "9.3.0"
    assert "libnccl.so.2" in libraries["nccl"]["error"]
    assert data["facts"]["cuda"]["ptxas"]["value"]["version"] == "12.5.82"
    assert "smoke" not in data


def test_hidden_library_is_an_error_with_the_fix(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    check = by_id(machine_facts("all", tf=tf_facts(2), cuda=cuda_stack(missing=("cudnn",))))[
        "cuda.libraries"
    ]
    assert check.status == "error"
    assert "cudnn: libcudnn.so.9 is not in LD_LIBRARY_PATH" in check.found
    assert "nvidia/cudnn/lib" in check.found
    assert "TensorFlow will not use the GPUs" in check.found
    assert "make venv CUDA=1" in check.fix and "make build" in check.fix
    assert "tensorflow[and-cuda]==2.21.0" in check.fix


def test_no_wheels_and_no_gpu_is_not_an_error(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    every = tuple(cudalibs.LIBRARY_NAMES)
    stack = cuda_stack(missing=every, ptxas=None, libdevice=False)
    results = by_id(machine_facts("all", tf=tf_facts(0), cuda=stack))
    check = results["cuda.libraries"]
    assert check.status == "skip"
    assert "none installed" in check.found and "only GPUs need them" in check.found
    assert "make venv CUDA=1" in check.found
    for key in ("cuda.nccl", "cuda.ptxas", "cuda.libdevice"):
        assert results[key].status == "skip"


def test_the_real_probe_of_this_machine_through_the_doctor(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    """This machine's real libraries: with no GPU the verdict is skip, never an error; with
    GPUs selected, each missing library is an error."""
    use_fake_nvml(fake_with(0))
    real = REAL_COLLECT({"PATH": "/usr/bin:/bin"}, 60)
    cpu = by_id(machine_facts("all", tf=tf_facts(0), cuda=real))["cuda.libraries"]
    assert cpu.status in ("ok", "skip")
    use_fake_nvml(fake_with(1))
    gpu = by_id(machine_facts("all", tf=tf_facts(1), cuda=real))["cuda.libraries"]
    assert gpu.status == ("ok" if not [n for n in real.missing if n != "nccl"] else "error")


def test_preflight_stops_on_a_missing_library(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    env = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    failing = preflight(runtime_for("0", env), tensorflow=tf_facts(1),
                        cuda=cuda_stack(missing=("cublas", "cublasLt")))
    (check,) = failing
    assert check.id == "cuda.libraries" and "libcublas.so.12" in check.found


def test_preflight_loads_the_libraries_when_gpus_are_used(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(1))
    calls: list[object] = []
    monkeypatch.setattr(cudalibs, "collect_in_process",
                        lambda environ=None: calls.append(environ) or cuda_stack())
    env = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert preflight(runtime_for("0", env), tensorflow=tf_facts(1)) == []
    assert len(calls) == 1  # in this process, whose environment the runtime has set
    use_fake_nvml(fake_with(0))
    assert preflight(runtime_for("all", {})) == []
    assert len(calls) == 1  # no GPU: nothing loaded


# --------------------------------------------------------------------------------- cuDNN


@pytest.mark.parametrize(("cudnn", "status"), [("9.1.0", "error"), ("9.3.1", "ok")])
def test_cudnn_older_minor_is_refused_newer_patch_is_fine(machine_facts: MachineFacts,
    use_fake_nvml: Install, cudnn: str, status: str
) -> None:
    use_fake_nvml(fake_with(1))
    check = by_id(machine_facts("all", tf=tf_facts(1, cudnn=cudnn)))["tensorflow.cudnn"]
    assert check.status == status
    if status == "error":
        assert "TensorFlow refuses" in check.found and "make venv CUDA=1" in check.fix


# ---------------------------------------------------------------------------------- NCCL


@pytest.mark.parametrize(
    ("gpus", "ops", "status"),
    [(1, "auto", "skip"), (2, "auto", "warn"), (2, "hierarchical_copy", "warn"),
     (2, "nccl", "error")],
)
def test_nccl_missing(machine_facts: MachineFacts, use_fake_nvml: Install, gpus: int, ops: str,
                      status: str) -> None:
    use_fake_nvml(fake_with(gpus))
    facts = machine_facts("all", tf=tf_facts(gpus), cuda=cuda_stack(missing=("nccl",)),
                       cross_device_ops=ops)
    results = by_id(facts)
    assert results["cuda.nccl"].status == status
    assert results["cuda.libraries"].status == "ok"  # NCCL is judged on its own line
    if status != "skip":
        assert "nvidia-nccl-cu12>=2.27.7" in results["cuda.nccl"].fix


def test_old_nccl_warns_with_two_gpus(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    check = by_id(machine_facts("all", tf=tf_facts(2), cuda=cuda_stack(nccl="2.21.5")))["cuda.nccl"]
    assert check.status == "warn" and "NCCL 2.21.5" in check.found


# ------------------------------------------------------------------------ ptxas, libdevice


def test_ptxas_missing_warns_when_xla_matters(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    stack = cuda_stack(ptxas=None, libdevice=False)
    with_xla = by_id(machine_facts("all", tf=tf_facts(1), cuda=stack, xla=True))
    ptxas = with_xla["cuda.ptxas"]
    assert ptxas.status == "warn"
    assert "XLA=1 compiles every GPU step with it" in ptxas.found
    assert "nvidia-cuda-nvcc-cu12 12.5" in ptxas.fix
    assert "--xla_gpu_cuda_data_dir" in ptxas.fix
    assert with_xla["cuda.libdevice"].status == "warn"
    without = by_id(machine_facts("all", tf=tf_facts(1), cuda=stack))
    assert without["cuda.ptxas"].status == "skip"
    assert "only XLA=1" in without["cuda.ptxas"].found


def test_ptxas_of_another_cuda_warns(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    facts = machine_facts("all", tf=tf_facts(1), cuda=cuda_stack(ptxas="12.8.93"), xla=True)
    check = by_id(facts)["cuda.ptxas"]
    assert check.status == "warn" and "not CUDA 12.5" in check.found


# ------------------------------------------------------------------------ driver, sm_90


def test_h100_runs_machine_code(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0))]))
    check = by_id(machine_facts("all", tf=tf_facts(1)))["gpu.0"]
    assert check.status == "ok", check
    assert "sm_90" in check.expected


def test_driver_expectation_does_not_promise_525_in_containers(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1, driver_version="535.104.05", cuda_driver_version=12020))
    check = by_id(machine_facts("all", tf=tf_facts(1)))["driver.version"]
    assert check.status == "warn"
    assert ">= 555.42.06" in check.expected
    assert "NVIDIA_REQUIRE_CUDA" in check.expected and "data-centre" in check.expected


# ----------------------------------------------------------------------- container, WSL2


def test_wsl2_is_not_an_error(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    host = healthy_host(device_files=Probed(value=()), wsl_gpu=Probed(value=True))
    check = by_id(make_facts("all", tf=tf_facts(1), host=host))["driver.device_files"]
    assert check.status == "ok" and "/dev/dxg" in check.found


# ---------------------------------------------------------------------- mixed precision


def test_bf16_on_volta_doctor_and_training_agree(machine_facts: MachineFacts,
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both through choose_precision: training refuses bf16 on 7.0, the doctor says error
    with training's own message."""
    with pytest.raises(ConfigError) as refused:
        choose_precision("bf16", "GPU", [(7, 0)])
    use_fake_nvml(fake_gpus([FakeGpu(name="Tesla V100", compute_capability=(7, 0))]))
    check = by_id(machine_facts("all", mixed_precision="bf16"))["gpu.mixed_precision"]
    assert check.status == "error"
    assert str(refused.value).splitlines()[0] in check.found
    assert "MIXED_PRECISION=fp16" in check.fix


def test_the_doctor_reads_the_precision_training_decided(machine_facts: MachineFacts,
    use_fake_nvml: Install
) -> None:
    """The doctor's precision line states the record training starts from (the same
    settings on the same GPUs), not a choice of its own."""
    from mgpu_env.config.resolve import resolve_settings
    from mgpu_env.runtime import decide, probe_machine

    use_fake_nvml(fake_gpus([FakeGpu(compute_capability=(8, 6)), FakeGpu()]))
    facts = machine_facts("all", mixed_precision="1")
    resolved = resolve_settings({"MIXED_PRECISION": "1"}, {})
    decided = decide(resolved, probe_machine(resolved.settings, {}), command="train")
    assert decided.precision is not None and facts.precision == decided.precision
    check = by_id(facts)["gpu.mixed_precision"]
    assert check.status == "ok"
    assert f"-> {decided.precision.policy}: {decided.precision.reason}" in check.found
