"""The keep limit: how much training data stays on each device (`training.keep`)."""

from __future__ import annotations

from pathlib import Path

from mgpu_env.training.input.keep import (
    FALLBACK_BYTES,
    GIB,
    MODEL_RESERVE_BYTES,
    host_available_bytes,
    keep_limit,
)


def test_a_gpu_keeps_half_its_free_memory_less_the_models_reserve() -> None:
    h200 = keep_limit([139 * 1024], None)
    assert h200.bytes == int(139 * GIB * 0.5) - MODEL_RESERVE_BYTES
    assert h200.keeps(60 * GIB) and not h200.keeps(70 * GIB)
    assert "67.5 GiB" in h200.note() and "139.0 GiB free" in h200.note()


def test_the_smallest_gpu_decides_and_a_full_one_keeps_nothing() -> None:
    assert keep_limit([80 * 1024, 8 * 1024], None).bytes == 2 * GIB
    assert keep_limit([3 * 1024], None).bytes == 0


def test_an_unknown_gpu_or_many_workers_keep_the_fixed_limit() -> None:
    assert keep_limit([80 * 1024, None], None).bytes == FALLBACK_BYTES
    assert keep_limit([80 * 1024], None, workers=2).bytes == FALLBACK_BYTES


def test_the_cpu_keeps_a_quarter_of_available_memory_per_copy() -> None:
    assert keep_limit([], 16 * GIB).bytes == 4 * GIB
    assert keep_limit([], 16 * GIB, cpu_replicas=2).bytes == 2 * GIB
    assert keep_limit([], None).bytes == FALLBACK_BYTES


def test_available_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683620 kB\nMemAvailable:    8000000 kB\n")
    assert host_available_bytes(meminfo) == 8_000_000 * 1024
    assert host_available_bytes(tmp_path / "missing") is None
