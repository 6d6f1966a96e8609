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
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor import smoke
from mgpu_env.doctor.smoke import SmokeResult, SmokeStep
from mgpu_env.runtime import Runtime
from tests.support.fake_doctor import healthy_host, versions
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.runtimes import runtime_of

Install = Callable[[FakeNvml], FakeNvml]
CPU = runtime_of({"GPUS": "all"})


@pytest.fixture(autouse=True)
def canned_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host())
    monkeypatch.setattr(probes, "probe_versions", lambda: versions())


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
    result = smoke.run(CPU, {}, timeout_s=0.5)
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
    result = smoke.run(CPU, {})
    assert not result.ok and "exited with code 139: Segmentation fault" in (result.error or "")


def test_settings_that_make_no_runtime_run_nothing() -> None:
    result = smoke.run(None, {})
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
    monkeypatch.setattr(smoke, "run", lambda runtime, env, timeout_s=None: asked.append(runtime)
                        or canned)
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
    assert list(steps) == ["setup", "all-reduce", "xla", "matmul"]
    assert all(s["ok"] and s["seconds"] >= 0 for s in steps.values())
    assert "sum 3 on every replica (expected 3)" in steps["all-reduce"]["detail"]
    assert "float32" in steps["matmul"]["detail"]
