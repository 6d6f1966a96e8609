"""Choosing the Keras mixed-precision policy from `MIXED_PRECISION` and the devices.

`choose_precision` is pure (device facts in, a decision out) so every branch is tested
without a GPU; `apply_precision` sets the global policy of the Keras `tf.keras` is and must
run before the model is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mgpu_env.config.errors import ConfigError
from mgpu_env.hardware import cpu

FLOAT32 = "float32"
MIXED_FLOAT16 = "mixed_float16"
MIXED_BFLOAT16 = "mixed_bfloat16"
# FP16 tensor cores arrived with Volta (7.0); native bf16 with Ampere (8.0).
FP16_TENSOR_CORES = (7, 0)
BF16_NATIVE = (8, 0)
# The MIXED_PRECISION value that asks for each policy outright: what a `mgpu bench` point
# names once MIXED_PRECISION=1 has been turned into a policy.
SETTING_OF_POLICY = {FLOAT32: "0", MIXED_FLOAT16: "fp16", MIXED_BFLOAT16: "bf16"}


@dataclass(frozen=True)
class PrecisionChoice:
    """The Keras policy for a run, whether it needs loss scaling, and why it was chosen."""

    policy: str  # float32, mixed_float16, mixed_bfloat16
    loss_scaling: bool  # fp16 gradients underflow without it; bf16 has float32's range
    reason: str
    # The policy MIXED_PRECISION=1 picks on the same devices (the fastest that runs there):
    # the doctor's advice compares the choice with it.
    fastest: str = ""

    @property
    def setting(self) -> str:
        """The MIXED_PRECISION value that asks for this policy outright (0, fp16, bf16)."""
        return SETTING_OF_POLICY[self.policy]


def fp16_tensor_cores(capability: tuple[int, int] | None) -> bool:
    """Whether a GPU of compute capability `capability` has FP16 tensor cores by the rule
    MIXED_PRECISION=1 follows (unknown: assumed, as the rule assumes)."""
    return capability is None or capability >= FP16_TENSOR_CORES


def runs_bf16(capability: tuple[int, int] | None) -> bool:
    """Whether MIXED_PRECISION=bf16 is accepted on a GPU of `capability` (unknown: yes)."""
    return capability is None or capability >= BF16_NATIVE


def choose_precision(
    mode: str,
    device_type: str,
    compute_capabilities: Sequence[tuple[int, int] | None] = (),
    cpu_flags: frozenset[str] | None = None,
) -> PrecisionChoice:
    """Turn MIXED_PRECISION (0, 1, fp16, bf16) into a policy for these devices.

    The one precision rule: the runtime's record (`runtime.record.decide`) calls it, and
    `mgpu train`, `mgpu bench` and the doctor read that decision.
    `device_type` is "GPU" or "CPU"; `compute_capabilities` lists each selected GPU's
    (major, minor), None where it could not be probed; `cpu_flags` are the CPU's
    instruction-set flags (None: this machine's). Raises ConfigError for a choice that
    cannot work on these devices.
    """
    on_gpu = device_type == "GPU"
    if cpu_flags is None:
        cpu_flags = cpu.cpu_flags()
    native_bf16 = cpu.has_native_bf16(cpu_flags)
    known = [cc for cc in compute_capabilities if cc is not None]
    lowest = min(known) if known else None
    fastest = _fastest_precision(on_gpu, native_bf16, lowest)
    if mode == "1":
        return dataclasses.replace(fastest, fastest=fastest.policy)
    if mode == "0":
        choice = PrecisionChoice(FLOAT32, False, "MIXED_PRECISION=0")
    elif mode == "fp16":
        reason = "MIXED_PRECISION=fp16 with dynamic loss scaling"
        if not on_gpu:
            reason += " (on the CPU fp16 is emulated and slow; bf16 is the faster choice)"
        choice = PrecisionChoice(MIXED_FLOAT16, True, reason)
    elif mode == "bf16":
        choice = _bf16_precision(on_gpu, native_bf16, lowest)
    else:
        raise ConfigError(f"Bad MIXED_PRECISION={mode!r}. Valid: 0, 1, fp16, bf16.")
    return dataclasses.replace(choice, fastest=fastest.policy)


def _capability_text(capability: tuple[int, int] | None) -> str:
    return f"{capability[0]}.{capability[1]}" if capability else "unknown"


def _fastest_precision(
    on_gpu: bool, native_bf16: bool, lowest: tuple[int, int] | None
) -> PrecisionChoice:
    """MIXED_PRECISION=1: the 16-bit type these devices run faster than float32, if any
    (`lowest`: the slowest GPU's compute capability, None when unknown)."""
    if not on_gpu:
        if native_bf16:
            return PrecisionChoice(
                MIXED_BFLOAT16, False,
                "MIXED_PRECISION=1 on a CPU with bf16 instructions: bf16 (no loss scaling)",
            )
        return PrecisionChoice(
            FLOAT32, False,
            "MIXED_PRECISION=1 but this CPU has no bf16 instructions (avx512_bf16, "
            "amx_bf16), where bf16 is emulated and slower than float32: float32",
        )
    if not fp16_tensor_cores(lowest):
        return PrecisionChoice(
            FLOAT32,
            False,
            f"MIXED_PRECISION=1 but the slowest GPU has compute capability "
            f"{_capability_text(lowest)}, without FP16 tensor cores (7.0+): float32 is as "
            "fast there",
        )
    return PrecisionChoice(
        MIXED_FLOAT16, True,
        f"MIXED_PRECISION=1 on GPUs with FP16 tensor cores (compute capability "
        f"{_capability_text(lowest)}): fp16 with dynamic loss scaling",
    )


def _bf16_precision(
    on_gpu: bool, native_bf16: bool, lowest: tuple[int, int] | None
) -> PrecisionChoice:
    """MIXED_PRECISION=bf16: refused on GPUs older than Ampere, which cannot run it."""
    if on_gpu and not runs_bf16(lowest):
        raise ConfigError(
            f"MIXED_PRECISION=bf16 needs GPUs of compute capability 8.0 (Ampere) or newer; "
            f"the selected GPUs go down to {_capability_text(lowest)}.\n"
            "  Valid here: 0, 1 or fp16. Fix: set MIXED_PRECISION=fp16 (or 1)."
        )
    reason = "MIXED_PRECISION=bf16 (no loss scaling)"
    if not on_gpu and not native_bf16:
        reason += " (this CPU has no bf16 instructions: emulated, slower than float32)"
    return PrecisionChoice(MIXED_BFLOAT16, False, reason)


def apply_precision(choice: PrecisionChoice) -> None:
    """Set the global dtype policy of the Keras `tf.keras` is (tf_keras under Keras 2, else
    Keras 3): the one the script's layers read. Call before building the model."""
    from mgpu_env.runtime.keras import tensorflow_keras

    tensorflow_keras().mixed_precision.set_global_policy(choice.policy)
