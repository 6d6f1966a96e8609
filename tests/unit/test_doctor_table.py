"""`mgpu doctor`'s table as a user reads it at 80 columns: short on a healthy CPU host,
every path and command whole, every check with --verbose, every check in --json."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from entrypoint.doctor import wrap_whole
from mgpu_env.doctor import facts as probes
from mgpu_env.hardware import cudalibs
from mgpu_env.hardware.cudalibs import LIBRARIES, CudaStack
from mgpu_env.hardware.limits import MachineLimits
from mgpu_env.hardware.nvml import Probed
from mgpu_env.tfprobes import tfprobe
from mgpu_env.tfprobes.tfprobe import TfFacts
from tests.support.fake_doctor import cuda_stack, healthy_host, tf_facts, versions
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakelimits import probed_limits

Install = Callable[[FakeNvml], FakeNvml]
WIDE = "/opt/a-rather-long-virtual-environment/lib/python3.12/site-packages"
MiB = 1024 * 1024


def healthy_limits_with_cpu_defaults() -> MachineLimits:
    """A workstation's defaults: memlock 8 MiB, stack 8 MiB (fine without a GPU)."""
    return probed_limits(rlimits={"memlock": (8 * MiB, 8 * MiB), "stack": (8 * MiB, None)})


@pytest.fixture(autouse=True)
def cpu_host(use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy machine without a GPU: NVML loads and lists none, no CUDA wheels."""
    use_fake_nvml(fake_with(0))
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host(
        in_container=Probed(value=False), device_files=Probed(value=()),
        limits=healthy_limits_with_cpu_defaults()))
    monkeypatch.setattr(probes, "probe_versions", lambda: versions())
    facts = tf_facts(0)
    stack = _with_long_paths(cuda_stack(missing=tuple(lib.name for lib in LIBRARIES),
                                        ptxas=None, libdevice=False))

    def collect_tf(environ: Mapping[str, str], timeout_s: float = 0) -> TfFacts:
        return facts

    def collect_cuda(environ: Mapping[str, str], timeout_s: float = 0) -> CudaStack:
        return stack

    monkeypatch.setattr(tfprobe, "collect", collect_tf)
    monkeypatch.setattr(cudalibs, "collect", collect_cuda)


def _with_long_paths(stack: CudaStack) -> CudaStack:
    """The wheel folder of a real virtual environment: longer than the Found column."""
    import dataclasses

    def longer(probed: Probed) -> Probed:  # type: ignore[type-arg]
        if probed.error:
            return Probed(error=probed.error.replace("/venv/lib/python3.12/site-packages", WIDE))
        return probed

    return dataclasses.replace(
        stack, libraries={k: longer(v) for k, v in stack.libraries.items()},
        ptxas=longer(stack.ptxas), libdevice=longer(stack.libdevice),
        wheel_root=f"{WIDE}/nvidia")


def doctor(*args: str) -> str:
    result = CliRunner().invoke(app, ["doctor", *args], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args", [(), ("--no-tf",)])
def test_a_healthy_cpu_host_gets_a_short_report(args: tuple[str, ...]) -> None:
    lines = doctor(*args).splitlines()
    assert len(lines) <= 27, "\n".join(lines)
    assert any(re.match(r"skip\s+\d+ GPU checks\s+no GPU \(GPUS=all", line) for line in lines)
    assert "--verbose lists the" in lines[-1]


def test_a_found_cudnn_is_not_a_skip() -> None:
    row = next(line for line in doctor().splitlines() if "cuDNN loaded" in line)
    assert row.startswith("ok") and "9.3.0" in row


def test_verbose_lists_every_check() -> None:
    checks = json.loads(doctor("--json"))["checks"]
    out = doctor("--verbose")
    for check in checks:
        assert check["title"] in out
    assert "GPU checks" not in out


@pytest.mark.parametrize("args", [(), ("--verbose",)])
def test_no_path_or_command_is_split(args: tuple[str, ...]) -> None:
    out = doctor(*args)
    for line in out.splitlines():
        # A line ends at a word: never inside a path or a backticked command.
        assert line.count("`") % 2 == 0, line
        assert not re.search(r"[/_.-]$", line.rstrip(",);")), line
    if args:
        assert f"{WIDE}/nvidia/nccl/lib" in out


def test_wrap_keeps_paths_and_commands_whole() -> None:
    text = "install with `pip install 'tensorflow[and-cuda]==2.21.0'` from /a/very/long/path/x"
    lines = wrap_whole(text, 20)
    assert "`pip install 'tensorflow[and-cuda]==2.21.0'`" in lines
    assert "/a/very/long/path/x" in lines
    assert " ".join(lines) == text


def test_json_keeps_every_check() -> None:
    data = json.loads(doctor("--json"))
    skipped = [c for c in data["checks"] if c["status"] == "skip"]
    assert len(skipped) >= 8
    kinds = {c["skipped_for"]["kind"] for c in skipped if c["skipped_for"]}
    assert kinds == {"GPU", "container"}
