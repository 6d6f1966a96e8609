"""`mgpu doctor` end to end through typer: exit codes, --json, --strict, --no-tf."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.doctor import facts as probes
from mgpu_env.tfprobes import tfprobe
from mgpu_env.tfprobes.tfprobe import TfFacts
from tests.support.fake_doctor import healthy_host, tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakelimits import probed_limits

Install = Callable[[FakeNvml], FakeNvml]
REAL_PROBE_HOST = probes.probe_host
REAL_PROBE_VERSIONS = probes.probe_versions
HEALTHY_DRIVER = {"driver_version": "555.42.06", "cuda_driver_version": 12050}


pytestmark = pytest.mark.usefixtures("canned_host")  # tests/conftest.py


def fake_tensorflow(monkeypatch: pytest.MonkeyPatch, facts: TfFacts) -> list[dict[str, str]]:
    calls: list[dict[str, str]] = []

    def collect(environ: Mapping[str, str], timeout_s: float = 0) -> TfFacts:
        calls.append(dict(environ))
        return facts

    monkeypatch.setattr(tfprobe, "collect", collect)
    return calls


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["doctor", *args], env=env)
    return result.exit_code, result.output


def test_healthy_machine_exits_0(use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    use_fake_nvml(fake_with(2, nvlink=True, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    calls = fake_tensorflow(monkeypatch, tf_facts(2))
    code, out = invoke()
    assert code == 0, out
    assert "Num GPUs Available: 2" in out
    assert "0 error(s), 0 warning(s)" in out
    assert calls and calls[0]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_no_tf_never_runs_tensorflow(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(1, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    calls = fake_tensorflow(monkeypatch, tf_facts(1))
    code, out = invoke("--no-tf")
    assert code == 0, out
    assert calls == []
    assert "TensorFlow checks  not probed (--no-tf)" in out


def test_error_exits_1_and_names_the_fix(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    fake_tensorflow(monkeypatch, tf_facts(0, cuda_build=False))
    code, out = invoke()
    assert code == 1, out
    assert "ERROR" in out and "tensorflow[and-cuda]" in out


def test_warning_exits_0_and_1_with_strict(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(0))
    code, out = invoke("--no-tf")
    assert code == 0, out
    assert "training will use the CPU" in out
    code, out = invoke("--no-tf", "--strict")
    assert code == 1, out
    assert "--strict" in out


@pytest.mark.parametrize(
    ("gpus", "nvml_fake", "code"),
    [
        ("0", fake_with(0), 2),  # GPUS=0 with no GPU: reported as an error, exit 2
        ("4", fake_with(2), 2),  # an index the machine does not have
        ("all", FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), 0),
        ("none", FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), 0),
    ],
)
def test_gpus_against_the_machine(
    use_fake_nvml: Install, gpus: str, nvml_fake: FakeNvml, code: int
) -> None:
    use_fake_nvml(nvml_fake)
    got, out = invoke("--no-tf", env={"GPUS": gpus})
    assert got == code, out
    if code == 2:
        assert f"there is no GPU {gpus}" in out
        assert "exit 2" in out


def test_unparsable_gpus_exits_2_before_probing(use_fake_nvml: Install) -> None:
    fake = use_fake_nvml(fake_with(1))
    code, out = invoke("--gpus", "first", "--no-tf")
    assert code == 2
    assert "Bad setting GPUS='first'" in out
    assert fake.initialised == 0


def test_json_has_every_check_and_the_facts(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2, unsupported={"nvmlDeviceGetMigMode"}))
    fake_tensorflow(monkeypatch, tf_facts(1))
    code, out = invoke("--json")
    data = json.loads(out)
    assert code == 1 == data["summary"]["exit_code"]
    for check in data["checks"]:
        assert set(check) >= {"id", "status", "found", "expected", "fix"}
        assert check["status"] in ("ok", "warn", "error", "skip")
    ids = {c["id"] for c in data["checks"]}
    assert {"driver.nvml", "gpu.0", "gpu.1", "gpu.topology", "visible.tensorflow"} <= ids
    facts = data["facts"]
    assert facts["request"] == "all"
    assert len(facts["nvml"]["listing"]["gpus"]) == 2
    mig = facts["nvml"]["listing"]["gpus"][0]["mig_enabled"]
    assert mig["value"] is None and "Not Supported" in mig["error"]
    assert facts["tensorflow"]["gpus"]["value"] == ["/physical_device:GPU:0"]
    assert facts["host"]["limits"]["shm"]["value"][0] > 0


def test_json_with_bad_index_still_reports(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    code, out = invoke("--json", "--no-tf", "--gpus", "3")
    data = json.loads(out)
    assert code == 2 == data["summary"]["exit_code"]
    request = next(c for c in data["checks"] if c["id"] == "visible.request")
    assert request["status"] == "error" and request["bad_setting"] is True


def test_small_shm_is_named_with_the_compose_setting(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_fake_nvml(fake_with(1, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    small_shm = probed_limits(tmp_path, shm_size=64 * 1024 * 1024)
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host(limits=small_shm))
    code, out = invoke("--no-tf")
    assert code == 0
    assert "64 MiB" in out and "shm_size" in out


def test_real_host_probes_never_crash(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real /dev/shm, rlimit, uid and versions of this machine.
    monkeypatch.setattr(probes, "probe_host", REAL_PROBE_HOST)
    monkeypatch.setattr(probes, "probe_versions", REAL_PROBE_VERSIONS)
    use_fake_nvml(fake_with(0))
    code, out = invoke("--json", "--no-tf")
    data = json.loads(out)
    assert code in (0, 1)
    assert data["facts"]["versions"]["Python"]["value"]
    assert data["facts"]["versions"]["TensorFlow"]["value"] == "2.21.0"


def test_no_tf_part_never_imports_tensorflow() -> None:
    """The NVML/host part never imports TensorFlow in the doctor's process (its speed is
    measured by benchmarks/doctor_time.py, not asserted in a test: a busy machine fails it)."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from mgpu_env.doctor import diagnose\n"
        "from mgpu_env.config.resolve import resolve_settings\n"
        "report = diagnose(resolve_settings({}, {}), os.environ, with_tensorflow=False)\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
        "print(len(report.checks))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) > 0  # the NVML and host checks ran
