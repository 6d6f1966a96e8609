"""The NVML probe: the one module that talks to the NVIDIA driver (through nvidia-ml-py).

Nothing else in mgpu-env imports `pynvml`. Tests replace `load_library` with a fake that
answers like NVML would (0, 1, 8 GPUs, old drivers, "Not Supported" queries), so the
selection and doctor logic is tested on machines with no GPU.

NVML enumerates GPUs in PCI bus order, which is nvidia-smi's order; with
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, CUDA (and TensorFlow) number the GPUs the same way.
NVML does not honour `CUDA_VISIBLE_DEVICES`, but it does only see the devices a container
was given (`NVIDIA_VISIBLE_DEVICES`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from mgpu_env.hardware import nvmlerrors

T = TypeVar("T")


def load_library() -> Any:
    """Import nvidia-ml-py. Replaced by a fake in tests."""
    import pynvml

    return pynvml


@dataclass(frozen=True)
class Probed(Generic[T]):
    """A probed value, or why it could not be collected."""

    value: T | None = None
    error: str | None = None
    # NVML's return code when NVML refused the question (nvmlerrors tells them apart).
    code: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def text(self) -> str:
        return str(self.value) if self.error is None else f"could not collect ({self.error})"


def probe(call: Callable[[], T]) -> Probed[T]:
    """Run one probe; its failure becomes a Probed error ('could not collect'), never a crash."""
    # One query that fails (NVML says "Not Supported" for many queries on some boards)
    # must never take the whole report down with it.
    try:
        return Probed(value=call())
    except Exception as err:
        return Probed(error=str(err) or type(err).__name__, code=nvmlerrors.code_of(err))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# nvmlClocksEventReasons bits with nvidia-smi's words (`nvidia-smi -q -d PERFORMANCE`).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "Idle", 0x2: "Applications Clocks Setting", 0x4: "SW Power Cap",
    0x8: "HW Slowdown", 0x10: "Sync Boost", 0x20: "SW Thermal Slowdown",
    0x40: "HW Thermal Slowdown", 0x80: "HW Power Brake Slowdown",
    0x100: "Display Clock Setting",
}


@dataclass(frozen=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows: rows remapped for correctable and uncorrectable errors, a
    remapping waiting for a reset, and a remapping that failed."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class GpuHealth:
    """What `nvidia-smi -q` shows about a GPU's health, each field on its own ("could not
    collect (Not Supported)" on boards without it, e.g. ECC on GeForce)."""

    # Uncorrectable ECC errors: since the driver loaded (volatile) and over the board's life.
    ecc_volatile_uncorrected: Probed[int] = field(default_factory=Probed)
    ecc_aggregate_uncorrected: Probed[int] = field(default_factory=Probed)
    retired_pages_pending: Probed[bool] = field(default_factory=Probed)  # before Ampere
    remapped_rows: Probed[RemappedRows] = field(default_factory=Probed)  # Ampere and later
    display_active: Probed[bool] = field(default_factory=Probed)
    persistence_mode: Probed[bool] = field(default_factory=Probed)
    clock_events: Probed[tuple[str, ...]] = field(default_factory=Probed)  # nvidia-smi words
    pcie_current: Probed[tuple[int, int]] = field(default_factory=Probed)  # generation, width


def _health(nvml: Any, handle: Any) -> GpuHealth:
    def ecc(counter: int) -> int:
        # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1; NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1
        return int(nvml.nvmlDeviceGetTotalEccErrors(handle, 1, counter))

    def remapped() -> RemappedRows:
        corr, unc, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def clock_events() -> tuple[str, ...]:
        getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # drivers before 535
        mask = int(getter(handle))
        return tuple(word for bit, word in CLOCK_EVENT_REASONS.items() if mask & bit)

    return GpuHealth(
        ecc_volatile_uncorrected=probe(lambda: ecc(0)),
        ecc_aggregate_uncorrected=probe(lambda: ecc(1)),
        retired_pages_pending=probe(
            lambda: int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)) == 1),
        remapped_rows=probe(remapped),
        display_active=probe(lambda: int(nvml.nvmlDeviceGetDisplayActive(handle)) == 1),
        persistence_mode=probe(lambda: int(nvml.nvmlDeviceGetPersistenceMode(handle)) == 1),
        clock_events=probe(clock_events),
        pcie_current=probe(lambda: (int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                                    int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))),
    )


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it. `index` is the nvidia-smi index."""

    index: int
    name: str
    uuid: str
    pci_bus_id: Probed[str] = field(default_factory=Probed)
    memory_total_mib: Probed[int] = field(default_factory=Probed)
    memory_free_mib: Probed[int] = field(default_factory=Probed)
    compute_capability: Probed[tuple[int, int]] = field(default_factory=Probed)
    mig_enabled: Probed[bool] = field(default_factory=Probed)
    # nvmlDeviceGetArchitecture as a name: "Turing", "Ampere", "Blackwell", ...
    architecture: Probed[str] = field(default_factory=Probed)
    # nvmlDeviceGetComputeMode: "default", "exclusive_thread", "prohibited",
    # "exclusive_process"; and how many compute processes run on the GPU now.
    compute_mode: Probed[str] = field(default_factory=Probed)
    processes: Probed[int] = field(default_factory=Probed)
    # Those processes: (pid, MiB of GPU memory it holds; None where NVML cannot say, as for
    # another container's processes).
    process_memory: Probed[tuple[tuple[int, int | None], ...]] = field(default_factory=Probed)
    # The link class, for what an all-reduce should reach: PCIe (max generation, max width)
    # and the active NVLinks with their version.
    pcie_link: Probed[tuple[int, int]] = field(default_factory=Probed)
    nvlinks: Probed[int] = field(default_factory=Probed)
    nvlink_version: Probed[int] = field(default_factory=Probed)
    health: GpuHealth = field(default_factory=GpuHealth)


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs are connected. `topology` is NVML's common-ancestor level name."""

    a: int
    b: int
    topology: Probed[str]
    p2p_read: Probed[bool]
    nvlink: Probed[bool]


NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS

# nvmlDeviceGetArchitecture's numbers (nvml.h NVML_DEVICE_ARCH_*).
ARCHITECTURES: dict[int, str] = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada",
    9: "Hopper", 10: "Blackwell", 13: "Rubin",
}
COMPUTE_MODES: dict[int, str] = {
    0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process",
}

# NVML's topology levels, nearest first, with the words nvidia-smi topo -m uses.
TOPOLOGY_NAMES: dict[int, str] = {
    0: "same board",  # NVML_TOPOLOGY_INTERNAL
    10: "single PCIe switch",  # NVML_TOPOLOGY_SINGLE (PIX)
    20: "multiple PCIe switches",  # NVML_TOPOLOGY_MULTIPLE (PXB)
    30: "PCIe host bridge",  # NVML_TOPOLOGY_HOSTBRIDGE (PHB)
    40: "same NUMA node, across host bridges",  # NVML_TOPOLOGY_NODE (NODE)
    50: "across CPU sockets",  # NVML_TOPOLOGY_SYSTEM (SYS)
}


@dataclass(frozen=True)
class FailedGpu:
    """A GPU NVML counts but cannot use: its handle, or a question every GPU answers, failed
    with a device-level code (fallen off the bus, reset required). `bus_id` is NVML's when it
    still answered that; None otherwise (the doctor then takes the PCI bus's order)."""

    index: int
    code: int | None
    error: str
    bus_id: str | None = None


@dataclass(frozen=True)
class GpuListing:
    """The GPUs NVML sees, or why NVML could not be asked (no driver, no library).
    `error_code`: NVML's return code for that (None: not an NVML answer, e.g. no
    nvidia-ml-py). `failed`: GPUs NVML counts that do not answer (the others are usable)."""

    gpus: tuple[GpuInfo, ...] = ()
    error: str | None = None
    error_code: int | None = None
    failed: tuple[FailedGpu, ...] = ()

    @property
    def available(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class NvmlSnapshot:
    """Everything the doctor needs from NVML, gathered in one pass."""

    listing: GpuListing
    driver_version: Probed[str] = field(default_factory=Probed)
    # The highest CUDA version the driver supports, as NVML encodes it (12040 = 12.4).
    cuda_driver_version: Probed[int] = field(default_factory=Probed)
    nvml_version: Probed[str] = field(default_factory=Probed)
    links: tuple[GpuLink, ...] = ()


def _init(nvml: Any) -> GpuListing | None:
    try:
        nvml.nvmlInit()
    except Exception as err:
        return GpuListing(error=f"NVML could not start: {err}",
                          error_code=nvmlerrors.code_of(err))
    return None


def _gpu_info(nvml: Any, index: int, handle: Any) -> GpuInfo:
    def memory(attribute: str) -> int:
        return int(getattr(nvml.nvmlDeviceGetMemoryInfo(handle), attribute)) // (1024 * 1024)

    def compute_capability() -> tuple[int, int]:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return int(major), int(minor)

    def mig_enabled() -> bool:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)

    def architecture() -> str:
        number = int(nvml.nvmlDeviceGetArchitecture(handle))
        return ARCHITECTURES.get(number, f"architecture {number}")

    def compute_mode() -> str:
        number = int(nvml.nvmlDeviceGetComputeMode(handle))
        return COMPUTE_MODES.get(number, f"mode {number}")

    def pcie_link() -> tuple[int, int]:
        return (int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)))

    def nvlinks() -> int:
        active = 0
        for link in range(NVLINK_MAX_LINKS):
            try:
                active += int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == 1
            except Exception:  # past the GPU's last link, or no NVLink at all
                break
        return active

    name = probe(lambda: _text(nvml.nvmlDeviceGetName(handle)))
    held = probe(lambda: _running(nvml, handle))
    uuid = probe(lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
    return GpuInfo(
        index=index,
        name=name.value if name.ok and name.value else f"GPU {index}",
        uuid=uuid.value if uuid.ok and uuid.value else "",
        pci_bus_id=probe(lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
        memory_total_mib=probe(lambda: memory("total")),
        memory_free_mib=probe(lambda: memory("free")),
        compute_capability=probe(compute_capability),
        mig_enabled=probe(mig_enabled),
        architecture=probe(architecture),
        compute_mode=probe(compute_mode),
        processes=Probed(value=len(held.value or ())) if held.ok else
        Probed(error=held.error, code=held.code),
        process_memory=held,
        pcie_link=probe(pcie_link),
        nvlinks=probe(nvlinks),
        nvlink_version=probe(lambda: int(nvml.nvmlDeviceGetNvLinkVersion(handle, 0))),
        health=_health(nvml, handle),
    )


def _running(nvml: Any, handle: Any) -> tuple[tuple[int, int | None], ...]:
    """The compute processes on a GPU: (pid, MiB it holds; None where NVML cannot say)."""

    def mib(used: object) -> int | None:
        # NVML_VALUE_NOT_AVAILABLE (2**64-1) or None: not visible from here.
        return int(used) // 2**20 if isinstance(used, int) and used < 2**63 else None

    return tuple((int(p.pid), mib(getattr(p, "usedGpuMemory", None)))
                 for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))


# The questions every working GPU answers: failing one of them with a code that is not
# query-level ("Not Supported") means the GPU itself is unusable.
_VITAL = ("pci_bus_id", "memory_total_mib")


def _handles(nvml: Any) -> tuple[dict[int, Any], list[FailedGpu]]:
    """Each GPU's handle by index, and the GPUs whose handle NVML would not give (one GPU
    off the bus must not hide the others, as it does not in nvidia-smi)."""
    handles: dict[int, Any] = {}
    failed: list[FailedGpu] = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            failed.append(FailedGpu(index, nvmlerrors.code_of(err), str(err) or repr(err)))
    return handles, failed


def _usable(gpu: GpuInfo) -> FailedGpu | None:
    for name in _VITAL:
        probed: Probed[Any] = getattr(gpu, name)
        if probed.code is not None and not nvmlerrors.is_query_only(probed.code):
            bus = gpu.pci_bus_id.value if gpu.pci_bus_id.ok else None
            return FailedGpu(gpu.index, probed.code, probed.error or "", bus)
    return None


def _listing(nvml: Any, handles: dict[int, Any], failed: list[FailedGpu]) -> GpuListing:
    gpus = []
    for index, handle in handles.items():
        gpu = _gpu_info(nvml, index, handle)
        broken = _usable(gpu)
        if broken is None:
            gpus.append(gpu)
        else:
            failed.append(broken)
    return GpuListing(gpus=tuple(gpus), failed=tuple(sorted(failed, key=lambda f: f.index)))


def _count_failed(err: Exception) -> GpuListing:
    return GpuListing(error=f"NVML could not list the GPUs: {err}",
                      error_code=nvmlerrors.code_of(err))


def _shutdown(nvml: Any) -> None:
    # Shutting down is best effort; the answers are already collected.
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _link(nvml: Any, a: int, b: int, handle_a: Any, handle_b: Any) -> GpuLink:
    def topology() -> str:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handle_a, handle_b))
        return TOPOLOGY_NAMES.get(level, f"level {level}")

    def p2p(index: int) -> bool:
        status = nvml.nvmlDeviceGetP2PStatus(handle_a, handle_b, index)
        return bool(status == nvml.NVML_P2P_STATUS_OK)

    # nvidia-ml-py declares NVML_P2P_CAPS_INDEX_READ as the tuple (0,): use the numbers.
    return GpuLink(
        a=a,
        b=b,
        topology=probe(topology),
        p2p_read=probe(lambda: p2p(0)),
        nvlink=probe(lambda: p2p(2)),
    )


def snapshot() -> NvmlSnapshot:
    """Driver, CUDA support, every GPU and every pair of GPUs. Never raises."""
    try:
        nvml = load_library()
    except Exception as err:
        return NvmlSnapshot(listing=GpuListing(error=f"nvidia-ml-py is not importable: {err}"))
    refused = _init(nvml)
    if refused:
        return NvmlSnapshot(listing=refused)
    try:
        try:
            handles, failed = _handles(nvml)
        except Exception as err:
            return NvmlSnapshot(listing=_count_failed(err))
        listing = _listing(nvml, handles, failed)
        usable = [g.index for g in listing.gpus]
        links = tuple(
            _link(nvml, a, b, handles[a], handles[b])
            for n, a in enumerate(usable)
            for b in usable[n + 1:]
        )
        return NvmlSnapshot(
            listing=listing,
            driver_version=probe(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
            cuda_driver_version=probe(lambda: int(nvml.nvmlSystemGetCudaDriverVersion_v2())),
            nvml_version=probe(lambda: _text(nvml.nvmlSystemGetNVMLVersion())),
            links=links,
        )
    finally:
        _shutdown(nvml)
