"""`mgpu doctor --smoke` between the devices: copies and the all-reduce's bandwidth.

`mgpu doctor --smoke` between the devices: a copy between each pair, and the all-reduce's bus
bandwidth over a few message sizes against what the link class should give.

- Bus bandwidth as nccl-tests defines it for an all-reduce (doc/PERFORMANCE.md there):
  `busbw = bytes / time * 2(n-1)/n`, which does not depend on the number of devices and
  compares with the hardware's link speed.
- What a link class should give, per direction: NVLink 2 to 4 about 25 GB/s per link (20 for
  NVLink 1), PCIe about 0.985 GB/s per lane for generation 3, doubling with each generation.
  A measured bus bandwidth under `SHORTFALL` of that is a warning with its likely cause.
- The child marks each phase on stderr (`PHASE_MARKER`), so the parent can stop a phase that
  makes no progress and name where it hung, with the likely cause from the host's P2P facts.

On logical CPU devices the steps run the same way (the mechanics are tested), but the
numbers mean nothing: every "device" shares one memory, and the report says so.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from mgpu_env.hardware.hostfacts import P2pHost
from mgpu_env.hardware.nvml import GpuInfo, GpuLink

PHASE_MARKER = "MGPU_SMOKE_PHASE "
# A copy, an all-reduce or a bandwidth size that shows no progress for this long is a hang.
PHASE_TIMEOUT_S = 30.0
COPY_ELEMENTS = 256 * 1024  # 1 MiB of float32 per copy
BANDWIDTH_BYTES = (1 << 20, 16 << 20, 64 << 20)  # per replica
ROUNDS = 3
SHORTFALL = 0.4
NVLINK_GBPS = {1: 20.0}  # per link and direction; NVLink 2, 3 and 4: 25
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
MEANINGLESS = ("logical CPU devices share one memory: these numbers mean nothing about a "
               "link, only that the mechanics work")


def phase(name: str) -> None:
    """Tell the parent which phase starts now (the child's stderr)."""
    print(PHASE_MARKER + name, file=sys.stderr, flush=True)


def bus_bandwidth(size_bytes: int, seconds: float, devices: int) -> float:
    """An all-reduce's bus bandwidth in GB/s, as nccl-tests defines it."""
    if seconds <= 0 or devices < 1:
        return 0.0
    return size_bytes / seconds * 2 * (devices - 1) / devices / 1e9


def expected_bandwidth(
    gpus: Sequence[GpuInfo], links: Sequence[GpuLink]
) -> tuple[float, str] | None:
    """What the slowest link between the GPUs should carry per direction (GB/s), and its
    class in words; None when NVML did not say."""
    if len(gpus) < 2:
        return None
    chosen = {g.index for g in gpus}
    between = [lk for lk in links if lk.a in chosen and lk.b in chosen]
    if between and all(lk.nvlink.ok and lk.nvlink.value for lk in between):
        counts = [g.nvlinks.value for g in gpus if g.nvlinks.ok and g.nvlinks.value]
        if not counts:
            return None
        version = next((g.nvlink_version.value for g in gpus if g.nvlink_version.ok
                        and g.nvlink_version.value), 3)
        per_link = NVLINK_GBPS.get(version or 3, 25.0)
        return per_link * min(counts), f"NVLink {version} x{min(counts)}"
    pcie = [g.pcie_link.value for g in gpus if g.pcie_link.ok and g.pcie_link.value]
    if not pcie:
        return None
    generation, width = min(pcie)
    speed = PCIE_LANE_GBPS.get(generation, 1.0) * width
    direct = between and all(lk.p2p_read.ok and lk.p2p_read.value for lk in between)
    if direct:
        return speed, f"PCIe {generation}.0 x{width} (P2P)"
    return speed / 2, f"PCIe {generation}.0 x{width} through host memory"


def shortfall(measured: float, expected: tuple[float, str], p2p: P2pHost | None) -> str | None:
    """A warning when the measured bus bandwidth is far under the link class's, with the
    likely cause; None when it is not."""
    speed, link = expected
    if measured >= SHORTFALL * speed:
        return None
    why = "a link trained below its generation or width (`nvidia-smi -q -d PCIE` shows it)"
    if p2p is not None and p2p.hypervisor.value:
        why = "a virtual machine, where P2P goes through the hypervisor"
    elif p2p is not None and (p2p.iommu_translates or p2p.acs_bridges.value):
        why = "P2P redirected through the CPU root complex (IOMMU or ACS)"
    return (f"all-reduce bus bandwidth {measured:.1f} GB/s is under {SHORTFALL:.0%} of what "
            f"{link} should carry ({speed:.0f} GB/s): likely {why}")


def hang_cause(where: str, p2p: P2pHost | None) -> str:
    """The likely cause of a hang in phase `where`, from the host's P2P facts."""
    if not where.startswith(("copy", "all-reduce", "bandwidth")):
        return ""
    if p2p is None:
        return "a broken P2P path between the GPUs"
    if p2p.hypervisor.value:
        return "GPUs passed into a virtual machine, where P2P rarely works"
    if p2p.iommu_translates:
        return "the IOMMU translating P2P traffic (IOMMU on, not in pass-through)"
    if p2p.acs_bridges.ok and p2p.acs_bridges.value:
        return "ACS on the PCIe bridges redirecting P2P traffic: " + ", ".join(
            p2p.acs_bridges.value)
    return "a broken P2P path between the GPUs (no IOMMU or ACS seen)"


# --------------------------------------------------------------------- in the child


def copy_pairs(tf: Any, devices: Sequence[str]) -> tuple[bool, str]:
    """Copy 1 MiB from each device to each other one and check it arrived whole."""
    slowest, wrong = (0.0, ""), []
    pairs = [(a, b) for a in devices for b in devices if a != b][:56]
    for number, (a, b) in enumerate(pairs):
        phase(f"copy {_short(a)}->{_short(b)}")
        start = time.perf_counter()
        with tf.device(a):
            x = tf.fill([COPY_ELEMENTS], float(number + 1))
        with tf.device(b):
            y = tf.identity(x)
            total = float(tf.reduce_sum(y))
        seconds = time.perf_counter() - start
        if abs(total - COPY_ELEMENTS * (number + 1)) > 1e-3 * total:
            wrong.append(f"{_short(a)}->{_short(b)}")
        slowest = max(slowest, (seconds, f"{_short(a)}->{_short(b)}"))
    if wrong:
        return False, "copies arrived wrong: " + ", ".join(wrong)
    return True, (f"{len(pairs)} copies of 1 MiB between {len(devices)} devices, slowest "
                  f"{slowest[1]} in {slowest[0] * 1000:.1f} ms")


def bandwidth(tf: Any, strategy: Any, replicas: int, device_type: str
              ) -> tuple[bool, str, tuple[tuple[int, float], ...]]:
    """The all-reduce's bus bandwidth at each of BANDWIDTH_BYTES (best of ROUNDS)."""
    values = []
    for size in BANDWIDTH_BYTES:
        phase(f"bandwidth {size >> 20} MiB")
        elements = size // 4

        @tf.function
        def reduce(n: int = elements) -> Any:
            def replica_fn() -> Any:
                context = tf.distribute.get_replica_context()
                return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([n]))

            return strategy.run(replica_fn)

        _ = [v.numpy()[0] for v in strategy.experimental_local_results(reduce())]  # warm-up
        times = []
        for _round in range(ROUNDS):
            start = time.perf_counter()
            results = strategy.experimental_local_results(reduce())
            firsts = [float(v.numpy()[0]) for v in results]
            times.append(time.perf_counter() - start)
            if any(abs(f - replicas) > 1e-3 for f in firsts):
                return False, f"the {size >> 20} MiB all-reduce summed to {firsts}", ()
        values.append((size, round(bus_bandwidth(size, min(times), replicas), 3)))
    detail = ", ".join(f"{size >> 20} MiB: {gbps:.2f} GB/s" for size, gbps in values)
    detail = f"bus bandwidth (nccl-tests' busbw) over {replicas} replicas: {detail}"
    if device_type != "GPU":
        detail += f" ({MEANINGLESS})"
    return True, detail, tuple(values)


def _short(device: str) -> str:
    return device.rsplit("/device:", 1)[-1]
