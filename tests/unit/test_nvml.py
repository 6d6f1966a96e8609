"""The NVML probe against a fake NVML: every answer it can give, and every way it fails."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from mgpu_env.hardware import nvml
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus, fake_with

Install = Callable[[FakeNvml], FakeNvml]


def test_no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml, "load_library", missing)
    snap = nvml.snapshot()
    assert not snap.listing.available
    assert "not importable" in (snap.listing.error or "")


def test_driver_not_loaded(use_fake_nvml: Install) -> None:
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    snap = nvml.snapshot()
    assert not snap.listing.available
    assert "NVML could not start" in (snap.listing.error or "")
    assert "Library Not Found" in (snap.listing.error or "")


@pytest.mark.parametrize("count", [0, 1, 2, 8])
def test_counts_and_pairs(use_fake_nvml: Install, count: int) -> None:
    fake = use_fake_nvml(fake_with(count))
    snap = nvml.snapshot()
    assert snap.listing.available
    assert [g.index for g in snap.listing.gpus] == list(range(count))
    assert len(snap.links) == count * (count - 1) // 2
    assert snap.driver_version.value == "550.54.15"
    assert snap.cuda_driver_version.value == 12040
    assert fake.initialised == 0, "every nvmlInit is matched by nvmlShutdown"


def test_gpu_fields(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(name="Tesla V100", compute_capability=(7, 0), mig=False),
                             FakeGpu(mig=True)]))
    first, second = nvml.snapshot().listing.gpus
    assert first.name == "Tesla V100"
    assert first.compute_capability.value == (7, 0)
    assert first.memory_total_mib.value == 80 * 1024
    assert first.mig_enabled.value is False
    assert second.mig_enabled.value is True
    assert first.uuid.startswith("GPU-") and first.uuid != second.uuid


def test_unsupported_queries_become_could_not_collect(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2, unsupported={
        "nvmlDeviceGetMigMode", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetName",
    }))
    snap = nvml.snapshot()
    gpu = snap.listing.gpus[0]
    assert gpu.name == "GPU 0"
    assert not gpu.mig_enabled.ok and "Not Supported" in (gpu.mig_enabled.error or "")
    assert gpu.mig_enabled.text().startswith("could not collect")
    assert not gpu.memory_free_mib.ok
    assert gpu.compute_capability.ok
    assert not snap.links[0].topology.ok and snap.links[0].p2p_read.ok
    assert not snap.cuda_driver_version.ok and snap.driver_version.ok


def test_listing_fails_when_count_fails(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2, unsupported={"nvmlDeviceGetCount"}))
    snap = nvml.snapshot()
    assert not snap.listing.available
    assert "could not list" in (snap.listing.error or "")


def test_link_names_and_per_pair_overrides(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(3, links={(0, 1): (0, True, True), (1, 2): (50, False, False)}))
    links = {(lk.a, lk.b): lk for lk in nvml.snapshot().links}
    assert links[(0, 1)].topology.value == "same board" and links[(0, 1)].nvlink.value
    assert links[(0, 2)].topology.value == "single PCIe switch"
    assert links[(1, 2)].topology.value == "across CPU sockets"
    assert links[(1, 2)].p2p_read.value is False
