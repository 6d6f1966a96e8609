"""`mgpu doctor` for humans and CI: the verdict first, JSON always, one warning per cause,
no trailing spaces, and `--report` (Markdown to paste into a bug, secrets masked)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import SCHEMA_VERSION, Diagnosis, diagnose
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor import report as bug
from mgpu_env.tfprobes import tfprobe
from mgpu_env.tfprobes.tfprobe import TfFacts
from tests.support.fake_doctor import healthy_host, tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with

Install = Callable[[FakeNvml], FakeNvml]
HEALTHY_DRIVER = {"driver_version": "555.42.06", "cuda_driver_version": 12050}


pytestmark = pytest.mark.usefixtures("canned_host")  # tests/conftest.py


@pytest.fixture(autouse=True)
def canned_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bug, "probe_nccl", lambda: "2.21.5 (nvidia-nccl-cu12)")


def fake_tensorflow(monkeypatch: pytest.MonkeyPatch, facts: TfFacts) -> None:
    def collect(environ: Mapping[str, str], timeout_s: float = 0) -> TfFacts:
        return facts

    monkeypatch.setattr(tfprobe, "collect", collect)


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["doctor", *args], env={"COLUMNS": "100", **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def test_verdict_line_comes_first_when_ready(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2, nvlink=True, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    fake_tensorflow(monkeypatch, tf_facts(2))
    code, out, _ = doctor()
    assert code == 0, out
    assert out.splitlines()[0] == "ready: 2 GPUs, TF 2.21.0, CUDA 12.5"


def test_verdict_line_says_not_ready_with_the_count(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    fake_tensorflow(monkeypatch, tf_facts(0, cuda_build=False))
    code, out, _ = doctor()
    assert code == 1
    # The TensorFlow build line and the TensorFlow GPUs line (the chain's line points there).
    assert out.splitlines()[0].startswith("not ready: 2 errors")


def test_strict_counts_warnings_in_the_verdict(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    code, out, _ = doctor("--no-tf", "--strict")
    assert code == 1
    assert out.splitlines()[0] == "not ready: 1 warning (--strict)"


def test_piped_table_has_no_trailing_spaces_and_no_escapes(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    fake_tensorflow(monkeypatch, tf_facts(1))
    _, out, _ = doctor()
    lines = out.splitlines()
    assert len(lines) > 20
    assert [line for line in lines if line != line.rstrip()] == []
    assert "\x1b" not in out


def test_no_driver_is_one_warning_not_three(use_fake_nvml: Install) -> None:
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    code, out, _ = doctor("--no-tf", "--json")
    assert code == 0
    data = json.loads(out)
    warned = [c["id"] for c in data["checks"] if c["status"] == "warn"]
    assert warned == ["driver.nvml"]
    assert data["verdict"] == "ready: CPU only, TF 2.21.0 (1 warning)"


def test_json_carries_schema_and_version(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(1, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    fake_tensorflow(monkeypatch, tf_facts(1))
    code, out, _ = doctor("--json")
    data = json.loads(out)
    assert code == 0 == data["summary"]["exit_code"]
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["mgpu_version"] == "0.1.0"
    assert data["ready"] is True and data["verdict"].startswith("ready: 1 GPU,")


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--gpus", "first"], {}), ([], {"EPOCHS": "zero"}), ([], {"XLA": "maybe"})],
)
def test_json_even_for_a_bad_setting(
    use_fake_nvml: Install, args: list[str], env: dict[str, str]
) -> None:
    use_fake_nvml(fake_with(1))
    code, out, err = doctor("--json", "--no-tf", *args, env=env)
    assert code == 2
    data = json.loads(out)  # a CI parser must not crash on an empty stdout
    assert data["ready"] is False and data["summary"]["exit_code"] == 2
    assert data["schema_version"] == SCHEMA_VERSION and data["mgpu_version"]
    assert "Bad setting" in data["settings_errors"][0]
    assert "Bad setting" in err


# ------------------------------------------------------------------------------ --report


def make_report(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], tmp_path: Path
) -> bug.BugReport:
    lock = tmp_path / "requirements.lock"
    lock.write_text("# pins\nnumpy==0.0.1\ntyper==0.29.1\nno-such-package==1.0\n")
    environ = {**environ, "MGPU_LOCK_FILE": str(lock), "MGPU_IMAGE_TAG": "mgpu-env:0.1.0"}
    resolved = resolve_settings({}, environ)
    monkeypatch.setattr(tfprobe, "collect", lambda env, timeout_s=0: tf_facts(2))
    report: Diagnosis = diagnose(resolved, environ)
    return bug.build_report(report, resolved, environ)


def test_report_has_every_section(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    report = make_report(monkeypatch, {"EPOCHS": "3"}, tmp_path)
    assert report.about.mgpu == "0.1.0" and report.about.image_tag == "mgpu-env:0.1.0"
    assert report.tensorflow["CUDA (build)"] == "12.5.1"
    assert report.tensorflow["cuDNN (build)"] == "9"
    assert report.driver["driver"] == "555.42.06"
    assert report.driver["CUDA (driver supports)"] == "12.5"
    assert [g.index for g in report.gpus] == [0, 1]
    assert report.gpus[0].compute_capability and report.gpus[0].memory.endswith("GiB")
    assert report.nccl.startswith("2.21.5")
    assert "logical CPUs" in report.system["CPU"] and "GiB" in report.system["RAM"]
    drift = {p.name: (p.locked, p.installed) for p in report.packages.value or ()}
    assert drift["numpy"][0] == "0.0.1" and drift["numpy"][1] != "0.0.1"
    assert drift["no-such-package"] == ("1.0", None)
    assert "typer" not in drift  # installed at its locked version
    assert report.settings["EPOCHS"] == {"value": "3", "source": "env"}
    assert report.settings["GPUS"] == {"value": "all", "source": "default"}


def test_report_masks_secrets(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_fake_nvml(fake_with(1, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    env_file = tmp_path / "x.env"
    env_file.write_text("WANDB_API_KEY=abc123\nNCCL_DEBUG=INFO\n")
    report = make_report(monkeypatch, {
        "ENV_FILE": str(env_file), "TF_HUB_TOKEN": "tok-999", "MGPU_DB_PASSWORD": "hunter2",
        "NCCL_SOCKET_IFNAME": "eth0",
        "MGPU_MIRROR_URL": "https://user:s3cret@example.invalid/simple",
    }, tmp_path)
    text = json.dumps(report.to_dict())
    for secret in ("abc123", "tok-999", "hunter2", "s3cret"):
        assert secret not in text
    assert report.environment["WANDB_API_KEY"] == bug.MASK
    assert report.environment["TF_HUB_TOKEN"] == bug.MASK
    assert report.environment["MGPU_MIRROR_URL"] == "https://user:****@example.invalid/simple"
    assert report.environment["NCCL_DEBUG"] == "INFO"
    assert report.environment["NCCL_SOCKET_IFNAME"] == "eth0"


def test_report_without_a_lock_says_why(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_fake_nvml(fake_with(0))
    probed = bug.probe_package_drift({"MGPU_LOCK_FILE": str(tmp_path / "missing.lock")})
    assert not probed.ok and "MGPU_LOCK_FILE" in probed.text()


def test_report_cli_prints_markdown(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    fake_tensorflow(monkeypatch, tf_facts(2))
    code, out, _ = doctor("--report", env={"EPOCHS": "2", "HF_TOKEN": "x", "TF_API_KEY": "k"})
    assert code == 0, out
    assert out.startswith("<details><summary>mgpu doctor --report: ready: 2 GPUs")
    for heading in ("### mgpu", "### System", "### TensorFlow", "### Driver and GPUs",
                    "### Packages that differ from requirements.lock", "### Settings"):
        assert heading in out
    assert "| EPOCHS | 2 | env |" in out
    assert "| 0 | " in out and "NCCL: 2.21.5" in out
    assert "TF_API_KEY=****" in out


def test_lock_lines_for_other_platforms_are_not_expected_here(tmp_path: Path) -> None:
    # The locks are universal: a Windows-only pin is not "missing" on Linux.
    from mgpu_env.doctor.report import read_lock

    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# a comment\n"
        "colorama==0.4.6 ; sys_platform == 'win32' \\\n"
        "    --hash=sha256:0000\n"
        "numpy==2.4.6 \\\n"
        "    --hash=sha256:1111\n"
        "tzdata==2026.6 ; sys_platform != 'win32'\n"
    )
    assert read_lock(lock) == {"numpy": "2.4.6", "tzdata": "2026.6"}


def test_report_has_the_kernels_side(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mgpu_env.hardware import nvidiahost
    from tests.support.fakemachine import machine_root

    root = machine_root(tmp_path / "machine", kernel="550.54.15", library="550.90.07")
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host(
        nvidia=nvidiahost.collect(root)))
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    report = make_report(monkeypatch, {}, tmp_path)
    assert report.driver["driver"].startswith("could not collect (NVML could not start")
    assert report.driver["kernel module"] == "550.54.15"
    assert report.driver["NVML library"].endswith("libnvidia-ml.so.550.90.07")
    assert report.driver["GPUs on the PCI bus"] == "0000:18:00.0, 0000:3b:00.0"
    assert report.driver["modules"] == "nvidia, nvidia_modeset, nvidia_uvm"
