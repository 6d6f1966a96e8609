"""MIXED_PRECISION -> Keras policy, for CPUs and GPUs of each generation."""

from __future__ import annotations

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.runtime.precision import choose_precision


@pytest.mark.parametrize(
    ("mode", "device", "capabilities", "policy", "loss_scaling"),
    [
        ("0", "GPU", [(8, 0)], "float32", False),
        ("0", "CPU", [], "float32", False),
        ("1", "GPU", [(7, 0), (8, 0)], "mixed_float16", True),
        ("1", "GPU", [(9, 0)], "mixed_float16", True),
        ("1", "GPU", [(6, 1)], "float32", False),  # Pascal: no FP16 tensor cores
        ("1", "GPU", [None], "mixed_float16", True),  # capability unknown: assume modern
        ("fp16", "GPU", [(6, 1)], "mixed_float16", True),
        ("fp16", "CPU", [], "mixed_float16", True),
        ("bf16", "CPU", [], "mixed_bfloat16", False),
        ("bf16", "GPU", [(8, 6)], "mixed_bfloat16", False),
    ],
)
def test_policy_choice(
    mode: str, device: str, capabilities: list, policy: str, loss_scaling: bool
) -> None:
    choice = choose_precision(mode, device, capabilities)
    assert (choice.policy, choice.loss_scaling) == (policy, loss_scaling)
    assert choice.reason


def test_one_slow_gpu_decides_for_all() -> None:
    choice = choose_precision("1", "GPU", [(8, 0), (6, 0)])
    assert choice.policy == "float32" and "6.0" in choice.reason


def test_bf16_on_pre_ampere_gpus_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        choose_precision("bf16", "GPU", [(7, 5)])
    message = str(caught.value)
    assert "7.5" in message and "MIXED_PRECISION=fp16" in message


def test_fp16_on_cpu_says_it_is_slow() -> None:
    assert "slow" in choose_precision("fp16", "CPU").reason


BF16_CPU = frozenset({"avx512f", "avx512_bf16"})
PLAIN_CPU = frozenset({"avx2", "fma"})


def test_mixed_precision_on_a_cpu_follows_its_bf16_instructions() -> None:
    # TF's mixed-precision guide: mixed_bfloat16 is slower than float32 where the CPU
    # emulates bf16; one rule decides it for train, bench and doctor.
    with_bf16 = choose_precision("1", "CPU", cpu_flags=BF16_CPU)
    assert (with_bf16.policy, with_bf16.loss_scaling) == ("mixed_bfloat16", False)
    without = choose_precision("1", "CPU", cpu_flags=PLAIN_CPU)
    assert without.policy == "float32" and "bf16 instructions" in without.reason
    explicit = choose_precision("bf16", "CPU", cpu_flags=PLAIN_CPU)
    assert explicit.policy == "mixed_bfloat16" and "slower" in explicit.reason


def test_cpu_flags_are_read_from_cpuinfo(tmp_path) -> None:
    from mgpu_env.hardware.cpu import _read_cpu_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert "avx512_bf16" in _read_cpu_flags(cpuinfo)
    assert _read_cpu_flags(tmp_path / "missing") == frozenset()


# ------------------------------------------------------- what `mgpu run` says of the precision


def _summary(settings: dict[str, str], scan: object = None) -> list[str]:
    from pathlib import Path

    from mgpu_env import launcher
    from tests.support.runtimes import runtime_of

    runtime = runtime_of({"GPUS": "none", **settings}, command="run")
    target = launcher.Target("train.py", False, (), Path("train.py"))
    return launcher.summary(runtime, target, scan)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "why"), [
    ("0", "MIXED_PRECISION=0"),
    ("1", "this CPU has no bf16 instructions"),  # the test machine's CPU is PLAIN_CPU
    ("fp16", "on the CPU fp16 is emulated and slow"),
])
def test_the_start_summary_always_says_why_the_precision(mode: str, why: str) -> None:
    lines = _summary({"MIXED_PRECISION": mode})
    (line,) = [line for line in lines if line.startswith("  precision: ")]
    assert why in line


def test_a_custom_loop_under_fp16_without_loss_scaling_gets_a_warning_with_the_fix() -> None:
    from mgpu_env.launcher.source_scan import Finding, ScriptScan

    loop = Finding("keras_2", ".apply_gradients()", "train.py", 52)
    warned = [line for line in _summary({"MIXED_PRECISION": "fp16"}, ScriptScan(
        apply_gradients=loop)) if line.startswith("  warning: ")]
    assert len(warned) == 1 and "train.py:52 calls apply_gradients" in warned[0]
    assert "LossScaleOptimizer(optimizer)" in warned[0] and "MIXED_PRECISION=bf16" in warned[0]
    # Loss scaling in the script, or no float16: no warning.
    for settings, scan in (({"MIXED_PRECISION": "fp16"},
                            ScriptScan(apply_gradients=loop, loss_scale_optimizer=True)),
                           ({"MIXED_PRECISION": "bf16"}, ScriptScan(apply_gradients=loop))):
        assert not any(line.startswith("  warning: ") for line in _summary(settings, scan))
