"""The compatibility table: lookups, version arithmetic, and its agreement with the lock."""

from __future__ import annotations

import re

import pytest

from mgpu_env.hardware import compat
from tests.support.children import REPO


def test_pinned_row_is_the_locked_tensorflow() -> None:
    lock = (REPO / "requirements.lock").read_text()
    locked = re.search(r"^tensorflow==([\d.]+)", lock, re.MULTILINE)
    assert locked, "requirements.lock pins no tensorflow"
    assert compat.minor_of(locked.group(1)) == compat.PINNED_TENSORFLOW
    row = compat.pinned()
    assert (row.cuda, row.cudnn) == ("12.5", "9.3")
    assert row.min_driver_linux == "555.42.06"  # CUDA 12.5 Update 1, what 2.21 is built with
    assert row.min_driver_linux_minor_compat == "525.60.13"


@pytest.mark.parametrize("version", ["2.21", "2.21.0", "2.21.0rc1", "2.21.3+nv"])
def test_for_tensorflow_accepts_release_spellings(version: str) -> None:
    assert compat.for_tensorflow(version) is compat.COMPAT["2.21"]


def test_for_tensorflow_unknown_is_none() -> None:
    assert compat.for_tensorflow("1.15.5") is None
    assert compat.for_tensorflow("not a version") is None


def test_every_row_has_a_driver_for_its_cuda() -> None:
    for row in compat.COMPAT.values():
        assert compat.driver_at_least(row.min_driver_linux, row.min_driver_linux_minor_compat)


def test_python_range() -> None:
    row = compat.COMPAT["2.21"]
    assert row.supports_python("3.11.7")
    assert row.supports_python("3.13")
    assert not row.supports_python("3.9.18")
    assert not row.supports_python("3.14.0")
    assert row.python_range == "3.10-3.13"


def test_driver_comparison_is_numeric() -> None:
    assert compat.driver_at_least("555.42.06", "555.42.02")
    assert not compat.driver_at_least("525.60.9", "525.60.13")
    assert compat.driver_at_least("570.26", "555.42.02")


def test_min_driver_for_cuda_and_nvml_encoding() -> None:
    built = compat.for_tensorflow("2.18")  # CUDA 12.5: its full-feature driver
    assert built is not None and built.min_driver_linux == "555.42.06"
    assert compat.cuda_from_nvml(12040) == "12.4"
    assert compat.cuda_from_nvml(13000) == "13.0"


def test_tensorflow_221_has_machine_code_for_hopper() -> None:
    """2.21's build info lists compute_90 only, but its wheel carries sm_90 cubins."""
    from mgpu_env.doctor.checks import capability_support

    reported = ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90")
    real = compat.build_capabilities("2.21.0", reported)
    assert "sm_90" in real and capability_support((9, 0), real) == "native"
    assert capability_support((10, 0), real) == "ptx"  # Blackwell: PTX, compiled at start
    assert compat.build_capabilities("2.17.0", reported) == reported
    assert compat.pinned().nccl_min == "2.27.7"


def test_driver_rows_are_the_release_notes_minimums() -> None:
    # CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver Versions", Linux.
    assert compat.CUDA_MIN_DRIVER_LINUX["12.5"] == "555.42.06"  # 12.5 Update 1
    assert compat.CUDA_MIN_DRIVER_LINUX["12.3"] == "545.23.06"
    assert compat.CUDA_MIN_DRIVER_LINUX["11.8"] == "520.61.05"
