"""What the CPU can do, for the precision decision: its instruction-set flags.

TensorFlow's mixed-precision guide: `mixed_bfloat16` runs significantly slower than float32
on CPUs without bf16 instructions (AVX512_BF16, AMX_BF16), which emulate it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from mgpu_env.hardware.hostroot import host_path

# The Linux /proc/cpuinfo flags that mean native bf16 arithmetic.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def _read_cpu_flags(cpuinfo: Path | None = None) -> frozenset[str]:
    try:
        text = (cpuinfo or host_path("/proc/cpuinfo")).read_text()
    except (OSError, ValueError):
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's flags (empty where /proc/cpuinfo is not there). Cached: it is a probe
    that tests replace, and the answer does not change while the process runs."""
    return _read_cpu_flags()


def has_native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & BF16_FLAGS)
