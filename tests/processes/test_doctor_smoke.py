"""`mgpu doctor --smoke`: the real job on 2 logical CPU devices (slow), a child that hangs
or crashes (exit 1 with the fix, no traceback), and the rendering of each step."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.doctor import smoke
from mgpu_env.doctor.smoke import SmokeResult, SmokeStep
from mgpu_env.runtime import Runtime
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.runtimes import runtime_of

Install = Callable[[FakeNvml], FakeNvml]
CPU = runtime_of({"GPUS": "all"})


pytestmark = pytest.mark.usefixtures("canned_host")  # tests/conftest.py


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["doctor", "--no-tf", *args], env=env)
    return result.exit_code, result.output


def python_that(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def test_a_hung_job_is_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", python_that(tmp_path, "sleep 30"))
    result = smoke.smoke_test(CPU, {}, timeout_s=0.5)
    assert not result.ok
    assert result.error == "the smoke job did not finish within 0.5 s (stopped)"
    assert "NCCL_DEBUG=INFO mgpu doctor --smoke" in result.fix
    assert result.seconds < 10


def test_hung_job_exits_1_with_the_fix_and_no_traceback(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_fake_nvml(fake_with(0))
    monkeypatch.setattr(sys, "executable", python_that(tmp_path, "sleep 30"))
    monkeypatch.setattr(smoke, "DEFAULT_TIMEOUT_S", 0.5)
    code, out = invoke("--smoke")
    assert code == 1, out
    assert "did not finish within 0.5 s" in out
    assert "CROSS_DEVICE_OPS=hierarchical_copy" in out
    assert "smoke job FAILED" in out
    assert "Traceback" not in out


def test_crashed_job_is_a_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable",
                        python_that(tmp_path, "echo 'Segmentation fault' >&2; exit 139"))
    result = smoke.smoke_test(CPU, {})
    assert not result.ok and "exited with code 139: Segmentation fault" in (result.error or "")


def test_settings_that_make_no_runtime_run_nothing() -> None:
    result = smoke.smoke_test(None, {})
    assert not result.ok and "settings do not fit" in (result.error or "")


def test_a_failed_step_is_rendered_with_its_fix(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(0))
    canned = SmokeResult(
        ok=False,
        steps=(
            SmokeStep("setup", True, 9.5, "2 replica(s) on 2 GPU device(s), nccl: auto"),
            SmokeStep("all-reduce", False, 0.2, "NcclError: unhandled system error",
                      smoke.FIX_ALL_REDUCE["nccl"]),
        ),
        devices=("GPU:0", "GPU:1"), device_type="GPU", cross_device_ops="nccl",
    )
    asked: list[Runtime | None] = []
    monkeypatch.setattr(smoke, "smoke_test",
                        lambda runtime, env, timeout_s=None, **kw: asked.append(runtime) or canned)
    code, out = invoke("--smoke", env={"VIRTUAL_DEVICES": "2"})
    assert code == 1
    # The job gets the runtime training would have: its split and all-reduce.
    (runtime,) = asked
    assert runtime is not None and runtime.split.per_device == 2
    assert runtime.strategy_plan.cross_device_ops == "reduction_to_one"
    assert "all-reduce" in out and "NcclError" in out and "9.50 s" in out
    assert "fix: NCCL_DEBUG=INFO" in out
    code, out = invoke("--smoke", "--json")
    data = json.loads(out)
    assert data["smoke"]["ok"] is False and data["summary"]["exit_code"] == 1
    assert [s["name"] for s in data["smoke"]["steps"]] == ["setup", "all-reduce"]


@pytest.mark.slow
def test_real_smoke_on_two_logical_cpu_devices(use_fake_nvml: Install) -> None:
    """The real job: TensorFlow in a child, 2 replicas on the CPU (reduction_to_one)."""
    use_fake_nvml(fake_with(0))
    code, out = invoke("--smoke", "--json", env={"VIRTUAL_DEVICES": "2"})
    data = json.loads(out)
    assert code == 0, data.get("smoke")
    result = data["smoke"]
    assert result["ok"] is True
    assert result["devices"] == ["CPU:0", "CPU:1"]
    assert result["cross_device_ops"] == "reduction_to_one"
    steps = {s["name"]: s for s in result["steps"]}
    assert list(steps) == ["setup", "copies", "all-reduce", "bandwidth", "xla", "matmul"]
    assert all(s["ok"] and s["seconds"] >= 0 for s in steps.values())
    assert "sum 3 on every replica (expected 3)" in steps["all-reduce"]["detail"]
    assert "2 copies of 1 MiB between 2 devices" in steps["copies"]["detail"]
    # The mechanics of the bandwidth measure work; on one CPU its numbers mean nothing.
    sizes = [size for size, _gbps in steps["bandwidth"]["values"]]
    assert sizes == [1 << 20, 16 << 20, 64 << 20]
    assert all(gbps > 0 for _size, gbps in steps["bandwidth"]["values"])
    assert "these numbers mean nothing" in steps["bandwidth"]["detail"]
    assert "float32" in steps["matmul"]["detail"]


# ------------------------------------------------------------ between the devices


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    from mgpu_env.doctor.links import bus_bandwidth

    # 1 GB in 1 s over 8 devices: algbw 1 GB/s, busbw 2*7/8 of it.
    assert bus_bandwidth(10**9, 1.0, 8) == pytest.approx(1.75)
    assert bus_bandwidth(10**9, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth(10**9, 0.0, 2) == 0.0


def test_expected_bandwidth_by_link_class(use_fake_nvml: Install) -> None:
    from mgpu_env.doctor.links import expected_bandwidth
    from mgpu_env.hardware import nvml
    from tests.support.fake_nvml import FakeGpu, fake_gpus

    use_fake_nvml(fake_gpus([FakeGpu(nvlinks=12) for _ in range(2)], nvlink=True))
    snapshot = nvml.snapshot()
    assert expected_bandwidth(snapshot.listing.gpus, snapshot.links) == (300.0, "NVLink 3 x12")
    use_fake_nvml(fake_gpus([FakeGpu(pcie=(4, 16)) for _ in range(2)]))
    snapshot = nvml.snapshot()
    speed, link = expected_bandwidth(snapshot.listing.gpus, snapshot.links) or (0, "")
    assert speed == pytest.approx(31.5, rel=0.01) and link == "PCIe 4.0 x16 (P2P)"
    use_fake_nvml(fake_gpus([FakeGpu(pcie=(3, 16)) for _ in range(2)], p2p_ok=False))
    snapshot = nvml.snapshot()
    assert "through host memory" in expected_bandwidth(snapshot.listing.gpus,
                                                       snapshot.links)[1]  # type: ignore[index]


def test_a_shortfall_names_its_likely_cause() -> None:
    from mgpu_env.doctor.links import shortfall
    from tests.support.fake_doctor import p2p_host

    link = (31.5, "PCIe 4.0 x16 (P2P)")
    assert shortfall(25.0, link, p2p_host()) is None
    slow = shortfall(3.0, link, p2p_host(iommu_groups=20))
    assert slow is not None and "IOMMU or ACS" in slow and "3.0 GB/s" in slow
    assert "virtual machine" in (shortfall(3.0, link, p2p_host(hypervisor=True)) or "")
    assert "nvidia-smi -q -d PCIE" in (shortfall(3.0, link, p2p_host()) or "")


def child_that_hangs_in(tmp_path: Path, phase: str) -> str:
    return python_that(tmp_path, f"echo 'MGPU_SMOKE_PHASE {phase}' >&2; sleep 30")


def test_a_hang_between_devices_is_named_with_its_likely_cause(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.support.fake_doctor import p2p_host

    monkeypatch.setattr(sys, "executable", child_that_hangs_in(tmp_path, "copy GPU:0->GPU:1"))
    result = smoke.smoke_test(CPU, {}, timeout_s=60, phase_timeout_s=0.5,
                       p2p=p2p_host(acs=("0000:00:03.1",)))
    assert not result.ok and result.hung_in == "copy GPU:0->GPU:1"
    assert "hung in copy GPU:0->GPU:1" in (result.error or "")
    assert "ACS on the PCIe bridges" in (result.error or "")
    assert "NCCL_P2P_DISABLE=1" in result.fix and result.seconds < 20


def test_a_hang_in_a_vm_gets_the_vm_fix(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    from mgpu_env.doctor.checks.host import FIX_P2P_VM
    from tests.support.fake_doctor import p2p_host

    monkeypatch.setattr(sys, "executable", child_that_hangs_in(tmp_path, "all-reduce"))
    result = smoke.smoke_test(CPU, {}, timeout_s=60, phase_timeout_s=0.5,
                       p2p=p2p_host(hypervisor=True))
    assert result.hung_in == "all-reduce" and result.fix == FIX_P2P_VM
    assert "virtual machine" in (result.error or "")


def test_a_bandwidth_warning_is_printed() -> None:
    import io

    from rich.console import Console

    from entrypoint.doctor import render_smoke

    result = SmokeResult(ok=True, steps=(SmokeStep("bandwidth", True, 1.0, "busbw [x]",
                                                   values=((1 << 20, 3.0),)),),
                         devices=("GPU:0", "GPU:1"), device_type="GPU",
                         warnings=("all-reduce bus bandwidth 3.0 GB/s is under 40% [of]",))
    out = io.StringIO()
    render_smoke(result, Console(file=out, width=120, no_color=True))
    text = out.getvalue()
    assert "WARN: all-reduce bus bandwidth 3.0 GB/s is under 40% [of]" in text
    assert "busbw [x]" in text
    assert smoke.from_json(smoke.to_json(result)) == result
