"""Output that cannot mislead: every fix on screen is the fix in --json, character for
character; TensorFlow's own reason is shown when it lists fewer GPUs; an impossible
precision exits 2 in the doctor as in `mgpu train --dry-run`."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from entrypoint.app import app
from entrypoint.doctor import render
from mgpu_env.doctor import Diagnosis, checks, smoke
from mgpu_env.doctor import facts as probes
from mgpu_env.doctor.checks import Check
from mgpu_env.hardware import cudaerrors
from mgpu_env.tfprobes import tflog, tfprobe
from tests.support.fake_doctor import healthy_host, make_facts, tf_facts, versions
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus, fake_with

Install = Callable[[FakeNvml], FakeNvml]
HEALTHY_DRIVER = {"driver_version": "555.42.06", "cuda_driver_version": 12050}

# Fixes that rich markup would eat, or that look like its escapes.
TRICKY_FIXES = (
    "`pip install 'tensorflow[and-cuda]==2.21.0'`",
    "pip install tensorflow[and-cuda] then [bold]restart[/bold] and [/] or \\[escaped] "
    "or [link=http://x]x[/link] or [red]",
    "a long fix " + "with many words " * 12 + "and `pip install 'nvidia-cudnn-cu12==9.3.*'`",
)


def every_fix_constant() -> list[str]:
    """Every FIX_* text of the doctor's modules, with sample values in its fields."""
    import importlib
    import pkgutil

    modules = [importlib.import_module(f"mgpu_env.doctor.checks.{m.name}")
               for m in pkgutil.iter_modules(checks.__path__)]
    modules += [smoke, cudaerrors, checks]
    texts: list[str] = []
    for module in modules:
        for name, value in vars(module).items():
            if not name.startswith("FIX"):
                continue
            values = value.values() if isinstance(value, dict) else [value]
            for text in values:
                if isinstance(text, str):
                    texts.append(text.format(tf="2.21.0", cuda="12.5", timeout=180, index=1,
                                             reasons="HW Slowdown", current=1, maximum=16)
                                 if "{" in text else text)
    texts += [e.fix for e in cudaerrors.ERRORS.values() if e.fix]
    return list(dict.fromkeys(texts))


def printed_fixes(text: str) -> dict[int, str]:
    """The numbered fixes as the table printed them, each unwrapped to one line."""
    fixes: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^\[(\d+)\] (.*)$", line)
        if match:
            current = int(match.group(1))
            fixes[current] = [match.group(2)]
        elif current is not None and line.startswith(" " * (len(str(current)) + 3)):
            fixes[current].append(line.strip())
        else:
            current = None
    return {n: " ".join(parts) for n, parts in fixes.items()}


def render_text(report: Diagnosis, width: int) -> str:
    out = io.StringIO()
    render(report, Console(file=out, width=width, no_color=True, force_terminal=False),
           strict=False)
    return out.getvalue()


@pytest.mark.parametrize("width", [60, 80, 200])
def test_every_fix_is_printed_as_json_has_it(use_fake_nvml: Install, width: int) -> None:
    use_fake_nvml(fake_with(1))
    facts = make_facts("all", tf=tf_facts(1))
    fixes = [*every_fix_constant(), *TRICKY_FIXES]
    assert len(fixes) > 20
    report = Diagnosis(tuple(Check(f"x.{i}", f"Check {i}", "error", "found", "", fix)
                          for i, fix in enumerate(fixes)), facts)
    shown = printed_fixes(render_text(report, width))
    for number, fix in enumerate(fixes, start=1):
        # Wrapping only ever replaces one space by a line break.
        assert shown[number] == " ".join(fix.split()), fix
    for check, fix in zip(report.to_dict()["checks"], fixes, strict=True):
        assert check["fix"] == fix


def test_the_and_cuda_fix_keeps_its_extra(use_fake_nvml: Install,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix users met most, printed whole (it lost `[and-cuda]` on a wrapped line)."""
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host())
    monkeypatch.setattr(probes, "probe_versions", lambda: versions())
    monkeypatch.setattr(tfprobe, "collect", lambda env, timeout_s=0: tf_facts(
        0, cuda_build=False))
    for columns in ("60", "80", "120"):
        result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": columns, "NO_COLOR": "1"})
        assert result.exit_code == 1
        fixes = printed_fixes(result.output)
        assert any("pip install 'tensorflow[and-cuda]==2.21.0'" in f for f in fixes.values())


# ------------------------------------------------------------ TensorFlow's own reason

CUINIT_LOG = """\
2025-01-01 10:00:00.000001: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.
2025-01-01 10:00:01.000002: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning
2025-01-01 10:00:02.000003: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152] \
failed call to cuInit: CUDA_ERROR_UNKNOWN: unknown error
2025-01-01 10:00:02.000004: I external/local_xla/xla/stream_executor/cuda/cuda_diagnostics.cc:\
137] retrieving CUDA diagnostic information for host: box
"""


@pytest.fixture
def child_with_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A stand-in for the probe's child Python: answers 0 GPUs, logs a cuInit failure."""
    answer = tfprobe.JSON_MARKER + tfprobe.to_json(tf_facts(0))
    (tmp_path / "stderr.txt").write_text(CUINIT_LOG)
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'stderr.txt'}' >&2\necho '{answer}'\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    yield str(script)


def test_the_probe_keeps_tensorflow_s_reason(child_with_log: str) -> None:
    facts = tfprobe.collect({})
    assert facts.num_gpus == 0
    assert facts.log[0].startswith("E external/local_xla/xla/stream_executor/cuda/cuda_driver")
    assert "failed call to cuInit: CUDA_ERROR_UNKNOWN" in facts.log[0]
    assert not any("oneDNN" in line for line in facts.log)


def test_relevant_lines_put_cuinit_and_dlopen_first() -> None:
    log = ("I noise\nW Could not load dynamic library 'libcudnn.so.9'; dlerror: libcudnn.so.9: "
           "cannot open shared object file\nE failed call to cuInit: CUDA_ERROR_NO_DEVICE\n"
           "W Cannot dlopen some GPU libraries. Please make sure ...\nI more noise\n")
    lines = tflog.relevant_lines(log)
    assert "cuInit" in lines[0]
    assert "Could not load dynamic library" in lines[1] and "Cannot dlopen" in lines[2]
    assert tflog.explain(lines) == (cudaerrors.describe(100).cause, cudaerrors.describe(100).fix)


def test_fewer_gpus_shows_the_reason_in_table_json_and_report(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, child_with_log: str
) -> None:
    use_fake_nvml(fake_with(2, **HEALTHY_DRIVER))  # type: ignore[arg-type]
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host())
    monkeypatch.setattr(probes, "probe_versions", lambda: versions())
    env = {"COLUMNS": "100", "NO_COLOR": "1"}
    table = CliRunner().invoke(app, ["doctor"], env=env).output
    assert "failed call to cuInit: CUDA_ERROR_UNKNOWN" in " ".join(table.split())
    assert "sudo nvidia-modprobe -u -c=0" in " ".join(printed_fixes(table).values())
    data = json.loads(CliRunner().invoke(app, ["doctor", "--json", "--report"], env=env).output)
    check = next(c for c in data["checks"] if c["id"] == "visible.tensorflow")
    assert "CUDA_ERROR_UNKNOWN" in check["found"] and check["fix"] == cudaerrors.FIX_UVM
    assert any("cuInit" in line for line in data["facts"]["tensorflow"]["log"])
    assert "cuInit" in data["report"]["tensorflow"]["TensorFlow's log"]
    report = CliRunner().invoke(app, ["doctor", "--report"], env=env).output
    assert "TensorFlow's log: " in report and "CUDA_ERROR_UNKNOWN" in report


# ------------------------------------------------------------- exit code of a precision


def test_bf16_on_volta_exits_2_in_the_doctor_and_the_dry_run(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(name="Tesla V100-SXM2-32GB", compute_capability=(7, 0))
                             for _ in range(2)], **HEALTHY_DRIVER))  # type: ignore[arg-type]
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host())
    monkeypatch.setattr(probes, "probe_versions", lambda: versions())
    doctor = CliRunner().invoke(app, ["doctor", "--no-tf"], env={"MIXED_PRECISION": "bf16"})
    assert doctor.exit_code == 2, doctor.output
    assert "MIXED_PRECISION=fp16" in doctor.output
    train = CliRunner().invoke(app, ["train", "--dry-run"], env={"MIXED_PRECISION": "bf16"})
    assert train.exit_code == 2, train.output
