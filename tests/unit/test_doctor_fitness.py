"""Whether this GPU can run this wheel, judged by NVML's architecture and board name, not
only the compute capability; compute modes in which TensorFlow cannot open a GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mgpu_env.doctor.checks import Check, run_checks
from mgpu_env.doctor.checks.gpus import FIX_BLACKWELL
from mgpu_env.doctor.facts import Facts
from tests.support.fake_doctor import tf_facts
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus

Install = Callable[[FakeNvml], FakeNvml]
MachineFacts = Callable[..., Facts]


def by_id(facts: object) -> dict[str, Check]:
    return {c.id: c for c in run_checks(facts)}  # type: ignore[arg-type]


def test_nvml_names_the_architecture(machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(name="NVIDIA GeForce GTX 1660 Ti",
                                     compute_capability=(7, 5))]))
    facts = machine_facts("all", tf=tf_facts(1))
    assert facts.gpus[0].architecture.value == "Turing"
    assert "Turing" in by_id(facts)["gpu.0"].found


@pytest.mark.parametrize("name", ["NVIDIA GeForce GTX 1660 Ti", "NVIDIA GeForce GTX 1650",
                                  "NVIDIA GeForce MX450"])
def test_a_gtx_16xx_has_no_tensor_cores(
        machine_facts: MachineFacts, use_fake_nvml: Install, name: str) -> None:
    """tensorflow#44191: mixed_float16 four times slower on a GTX 1660 Ti."""
    use_fake_nvml(fake_gpus([FakeGpu(name=name, compute_capability=(7, 5))]))
    for mode in ("1", "fp16"):
        checks = by_id(machine_facts("all", tf=tf_facts(1), mixed_precision=mode))
        assert "FP16 tensor cores: no" in checks["gpu.0"].found
        precision = checks["gpu.mixed_precision"]
        assert precision.status == "warn" and "MIXED_PRECISION=0" in precision.fix
        assert "tensorflow#44191" in precision.fix
    quiet = by_id(machine_facts("all", tf=tf_facts(1), mixed_precision="0"))
    assert quiet["gpu.mixed_precision"].fix == ""  # no "would use the tensor cores" tip


def test_an_rtx_2080_keeps_its_tensor_cores(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(name="NVIDIA GeForce RTX 2080 Ti",
                                     compute_capability=(7, 5))]))
    checks = by_id(machine_facts("all", tf=tf_facts(1), mixed_precision="1"))
    assert "FP16 tensor cores: yes" in checks["gpu.0"].found
    assert checks["gpu.mixed_precision"].status == "ok"


@pytest.mark.parametrize(("name", "cc"), [("NVIDIA GeForce RTX 5090", (12, 0)),
                                          ("NVIDIA B200", (10, 0))])
def test_blackwell_is_an_error_with_the_fix(
        machine_facts: MachineFacts, use_fake_nvml: Install, name: str,
                                            cc: tuple[int, int]) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(name=name, compute_capability=cc)]))
    checks = by_id(machine_facts("all", tf=tf_facts(1)))
    assert checks["gpu.0"].status == "error" and checks["gpu.0"].fix == FIX_BLACKWELL
    assert "Blackwell" in checks["gpu.0"].found


@pytest.mark.parametrize(("mode", "processes", "status"), [
    (0, 3, "ok"), (3, 0, "ok"), (3, 1, "error"), (1, 0, "error"), (2, 0, "error")])
def test_compute_modes(
        machine_facts: MachineFacts, use_fake_nvml: Install, mode: int, processes: int,
                       status: str) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(compute_mode=mode, processes=processes)]))
    check = by_id(machine_facts("all", tf=tf_facts(1)))["gpu.0"]
    assert check.status == status
    if status == "error":
        assert "nvidia-smi -i 0 -c DEFAULT" in check.fix


# ----------------------------------------------------- XLA judged by what the run does


@pytest.mark.parametrize(("settings", "matters"), [
    ({}, False), ({"XLA": "1"}, True), ({"KERAS": "2"}, True)])
def test_xla_tools_matter_where_the_run_compiles_with_xla(machine_facts: MachineFacts,
    use_fake_nvml: Install, settings: dict[str, str], matters: bool
) -> None:
    """keras-team/keras#17422: tf_keras's optimizers need libdevice with XLA never asked."""
    from tests.support.fake_doctor import cuda_stack

    use_fake_nvml(fake_gpus([FakeGpu()]))
    facts = machine_facts("all", tf=tf_facts(1), cuda=cuda_stack(libdevice=False, ptxas=None),
                       settings=settings)
    checks = by_id(facts)
    for check_id in ("cuda.libdevice", "cuda.ptxas"):
        assert checks[check_id].status == ("warn" if matters else "skip"), checks[check_id]
    if settings.get("KERAS") == "2":
        assert "keras-team/keras#17422" in checks["cuda.libdevice"].found
