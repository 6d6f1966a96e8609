"""A stand-in for nvidia-ml-py that answers like NVML on a given set of GPUs.

It raises nvidia-ml-py's own NVMLError classes, so the probe code meets the same
exceptions it meets on real boards ("Not Supported", "Driver Not Loaded", ...).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3


@dataclass
class FakeGpu:
    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = ""
    memory_total: int = 80 * GIB
    memory_free: int = 79 * GIB
    compute_capability: tuple[int, int] = (8, 0)
    mig: bool = False
    bus_id: str = ""
    architecture: int | None = None  # NVML_DEVICE_ARCH_*; None: from the compute capability
    compute_mode: int = 0  # NVML_COMPUTEMODE_DEFAULT
    processes: int = 0  # compute processes running on it
    pcie: tuple[int, int] = (4, 16)  # max PCIe generation and width
    nvlinks: int = 0  # active NVLinks
    nvlink_version: int = 3
    # Health, as nvidia-smi -q shows it (defaults: a healthy data-centre board).
    ecc_volatile: int = 0  # uncorrectable ECC errors since the driver loaded
    ecc_aggregate: int = 0  # over the board's life
    retired_pending: bool = False
    remapped: tuple[int, int, bool, bool] = (0, 0, False, False)
    display_active: bool = False
    persistence: bool = True
    clock_events: int = 0x1  # nvmlClocksEventReason bits (Idle)
    pcie_current: tuple[int, int] | None = None  # None: the maximum


# Compute capability major -> NVML_DEVICE_ARCH_* (7.5 is Turing, 8.9 Ada).
_ARCH_OF = {3: 2, 5: 3, 6: 4, 7: 5, 8: 7, 9: 9, 10: 10, 12: 10}


@dataclass
class FakeNvml:
    """Pass as `mgpu_env.hardware.nvml.load_library`'s result. Configure GPUs and failures."""

    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    init_error: int | None = None  # e.g. pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    unsupported: set[str] = field(default_factory=set)  # names of queries that fail
    # Queries that fail with a given NVML code, for every GPU: {"nvmlDeviceGetMemoryInfo": 15}.
    errors: dict[str, int] = field(default_factory=dict)
    # GPUs whose handle NVML refuses, by index, with the code (one GPU off the bus: {2: 15}).
    handle_errors: dict[int, int] = field(default_factory=dict)
    topology_level: int = 10  # NVML_TOPOLOGY_SINGLE
    p2p_ok: bool = True
    nvlink: bool = False
    # Per-pair overrides, keyed by (index a, index b) with a < b: (topology level, p2p, nvlink).
    links: dict[tuple[int, int], tuple[int, bool, bool]] = field(default_factory=dict)
    initialised: int = 0

    # Constants the probe reads from the module.
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK
    NVMLError = pynvml.NVMLError

    def __post_init__(self) -> None:
        for i, gpu in enumerate(self.gpus):
            gpu.uuid = gpu.uuid or f"GPU-{i:08x}-1111-2222-3333-44445555666{i % 10}"
            gpu.bus_id = gpu.bus_id or f"00000000:{0x10 + i:02X}:00.0"

    def _check(self, query: str) -> None:
        if self.initialised <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if query in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if query in self.errors:
            raise pynvml.NVMLError(self.errors[query])

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check("nvmlSystemGetNVMLVersion")
        return "12." + self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        if index in self.handle_errors:
            raise pynvml.NVMLError(self.handle_errors[index])
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        self._check("nvmlDeviceGetName")
        return gpu.name

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        self._check("nvmlDeviceGetUUID")
        return gpu.uuid

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        self._check("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=gpu.bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(
            total=gpu.memory_total, free=gpu.memory_free, used=gpu.memory_total - gpu.memory_free
        )

    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGpu) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability")
        return gpu.compute_capability

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> tuple[int, int]:
        self._check("nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetArchitecture(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetArchitecture")
        if gpu.architecture is not None:
            return gpu.architecture
        major, minor = gpu.compute_capability
        return 6 if (major, minor) == (7, 5) else 8 if (major, minor) == (8, 9) else \
            _ARCH_OF.get(major, 0xFFFFFFFF)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkGeneration")
        return gpu.pcie[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkWidth")
        return gpu.pcie[1]

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState")
        if link >= max(gpu.nvlinks, 1) or not gpu.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1

    def nvmlDeviceGetNvLinkVersion(self, gpu: FakeGpu, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkVersion")
        if not gpu.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.nvlink_version

    def nvmlDeviceGetComputeMode(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetComputeMode")
        return gpu.compute_mode

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=1000 + i, usedGpuMemory=GIB) for i in range(gpu.processes)]

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors")
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return gpu.ecc_volatile if counter == pynvml.NVML_VOLATILE_ECC else gpu.ecc_aggregate

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetRetiredPagesPendingStatus")
        return pynvml.NVML_FEATURE_ENABLED if gpu.retired_pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows")
        corr, unc, pending, failure = gpu.remapped
        return corr, unc, int(pending), int(failure)

    def nvmlDeviceGetDisplayActive(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetDisplayActive")
        return int(gpu.display_active)

    def nvmlDeviceGetPersistenceMode(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetPersistenceMode")
        return int(gpu.persistence)

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons")
        return gpu.clock_events

    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkGeneration")
        return (gpu.pcie_current or gpu.pcie)[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrPcieLinkWidth")
        return (gpu.pcie_current or gpu.pcie)[1]

    def _link(self, a: FakeGpu, b: FakeGpu) -> tuple[int, bool, bool]:
        ia = next(i for i, g in enumerate(self.gpus) if g is a)
        ib = next(i for i, g in enumerate(self.gpus) if g is b)
        default = (self.topology_level, self.p2p_ok, self.nvlink)
        return self.links.get((min(ia, ib), max(ia, ib)), default)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGpu, b: FakeGpu) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor")
        return self._link(a, b)[0]

    def nvmlDeviceGetP2PStatus(self, a: FakeGpu, b: FakeGpu, index: int) -> int:
        self._check("nvmlDeviceGetP2PStatus")
        _level, p2p, nvlink = self._link(a, b)
        ok = nvlink if index == 2 else p2p
        return pynvml.NVML_P2P_STATUS_OK if ok else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED


def fake_with(count: int, **kwargs: Any) -> FakeNvml:
    """A fake NVML with `count` identical GPUs."""
    return FakeNvml(gpus=[FakeGpu() for _ in range(count)], **kwargs)


def fake_gpus(gpus: Iterable[FakeGpu], **kwargs: Any) -> FakeNvml:
    return FakeNvml(gpus=list(gpus), **kwargs)
