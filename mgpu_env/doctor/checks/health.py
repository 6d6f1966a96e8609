"""Each GPU's health, in nvidia-smi's words.

As `nvidia-smi -q` reports it: what makes training fail (uncorrectable ECC errors, a retired
page or a row remapping waiting for a reset) is an error; what makes it slow or fragile (a
display's watchdog, clocks held down, a PCIe link trained narrower than the slot, persistence
off) a warning. A field the board does not report is "could not collect (why)", never a
failure."""

from __future__ import annotations

from typing import Any

from mgpu_env.doctor.checks.common import Check, CheckId, Status, check, no_gpu
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware.nvml import GpuHealth, GpuInfo, Probed

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
GPU_HEALTH = CheckId("gpu.health")

FIX_RESET = ("reset the GPU while nothing runs on it (`sudo nvidia-smi -r -i {index}`) or "
             "reboot, so that the driver retires the pages / remaps the rows")
FIX_ECC = ("uncorrectable ECC errors since the driver loaded: stop the jobs on GPU {index}, "
           "reset it (`sudo nvidia-smi -r -i {index}`); if they come back, the board needs "
           "replacing; GPUS= without it meanwhile")
FIX_DISPLAY = ("a display is attached to GPU {index}: the kernel's watchdog stops CUDA "
               "kernels that run for seconds (CUDA_ERROR_LAUNCH_TIMEOUT): train on a GPU "
               "without a display (GPUS=), or run the machine headless")
FIX_PERSISTENCE = ("`sudo nvidia-smi -pm 1` (or enable nvidia-persistenced), so the driver "
                   "stays loaded between runs")
FIX_CLOCKS = ("clocks held down ({reasons}): check cooling and power (`nvidia-smi -q -d "
              "PERFORMANCE,TEMPERATURE,POWER`); a lowered power limit: `sudo nvidia-smi -i "
              "{index} -pl <watts>`")
FIX_PCIE = ("the link trained at x{current} in an x{maximum} slot (a riser, a wrong slot or "
            "a dirty contact): every all-reduce crosses it: reseat the GPU in a full-width "
            "slot")
# Clock reasons that mean the GPU is held below what it can do (not Idle, not a setting).
SLOWDOWNS = ("SW Power Cap", "HW Slowdown", "SW Thermal Slowdown", "HW Thermal Slowdown",
             "HW Power Brake Slowdown")


def _findings(gpu: GpuInfo) -> list[tuple[Status, str, str]]:
    """(status, nvidia-smi's words, fix) for everything wrong with `gpu`."""
    h: GpuHealth = gpu.health
    index = gpu.index
    out: list[tuple[Status, str, str]] = []
    if h.ecc_volatile_uncorrected.value:
        out.append(("error", f"Volatile Uncorrectable ECC errors: "
                    f"{h.ecc_volatile_uncorrected.value}", FIX_ECC.format(index=index)))
    if h.ecc_aggregate_uncorrected.value and not h.ecc_volatile_uncorrected.value:
        out.append(("warn", f"Aggregate Uncorrectable ECC errors: "
                    f"{h.ecc_aggregate_uncorrected.value}",
                    "earlier uncorrectable errors on this board: watch `nvidia-smi -q -d ECC`"))
    if h.retired_pages_pending.value:
        out.append(("error", "Retired Pages: Pending Page Blacklist: Yes",
                    FIX_RESET.format(index=index)))
    rows = h.remapped_rows.value
    if rows is not None and rows.failure:
        out.append(("error", "Remapped Rows: Remapping Failure Occurred: Yes",
                    "the GPU could not remap a failing memory row: the board needs "
                    f"replacing; GPUS= without GPU {index}"))
    elif rows is not None and rows.pending:
        out.append(("error", "Remapped Rows: Pending: Yes", FIX_RESET.format(index=index)))
    if h.display_active.value:
        out.append(("warn", "Display Active: Enabled", FIX_DISPLAY.format(index=index)))
    elif h.persistence_mode.ok and h.persistence_mode.value is False:
        out.append(("warn", "Persistence Mode: Disabled", FIX_PERSISTENCE))
    slow = [r for r in h.clock_events.value or () if r in SLOWDOWNS]
    if slow:
        out.append(("warn", "Clocks Event Reasons: " + ", ".join(slow),
                    FIX_CLOCKS.format(reasons=", ".join(slow), index=index)))
    current, maximum = h.pcie_current.value, gpu.pcie_link.value
    if current is not None and maximum is not None and current[1] < maximum[1]:
        out.append(("warn", f"PCIe Link Width: Current x{current[1]}, Max x{maximum[1]}",
                    FIX_PCIE.format(current=current[1], maximum=maximum[1])))
    return out


def _unknown(h: GpuHealth) -> list[str]:
    names: dict[str, Probed[Any]] = {"ECC": h.ecc_volatile_uncorrected, "display": h.display_active,
             "persistence": h.persistence_mode, "clocks": h.clock_events,
             "PCIe link": h.pcie_current}
    unknown = [f"{name} could not collect ({p.error})" for name, p in names.items() if not p.ok]
    # Boards before Ampere retire pages, Ampere and later remap rows: one of the two is
    # always "Not Supported"; only neither answering is worth saying.
    if not h.retired_pages_pending.ok and not h.remapped_rows.ok:
        unknown.append(f"page retirement could not collect ({h.remapped_rows.error})")
    return unknown


@check(180, GPU_HEALTH, preflight=True)
def check_health(facts: Facts) -> Check | list[Check]:
    expected = "no uncorrectable ECC error, nothing pending a reset, full clocks and link"
    gpus = facts.selected
    if not gpus:
        return GPU_HEALTH("GPU health", "skip", "no GPU used", expected,
                          skipped_for=no_gpu(facts))
    checks = []
    for gpu in gpus:
        title = f"GPU {gpu.index} health"
        found = _findings(gpu)
        unknown = _unknown(gpu.health)
        if not found:
            text = "healthy" + (f" ({'; '.join(unknown)})" if unknown else "")
            checks.append(GPU_HEALTH.child(gpu.index)(title, "ok", text, expected))
            continue
        status: Status = "error" if any(s == "error" for s, _, _ in found) else "warn"
        checks.append(GPU_HEALTH.child(gpu.index)(title, status,
                                       "; ".join(words for _, words, _ in found), expected,
                                       "; ".join(fix for _, _, fix in found)))
    return checks


def failing(gpu: GpuInfo) -> list[str]:
    """What makes `gpu` fail training, in nvidia-smi's words (the errors of `check_health`,
    its warnings left out): empty for a GPU worth training on. A recovery reads it to
    choose the GPUs a restarted run leaves out."""
    return [words for status, words, _ in _findings(gpu) if status == "error"]
