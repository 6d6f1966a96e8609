"""The chain's machine layers, from the PCI bus to NVML.

The chain's machine layers: PCI bus, kernel driver, nvidia module, device files, the user-space
driver and NVML. Each is a function of the facts and the GPUs passing below."""

from __future__ import annotations

import os
import re

from mgpu_env.doctor.chaintypes import Drop, Layer, Passing, Step, between, unknown
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import assignment, cudaerrors, openerrors, pcibus
from mgpu_env.hardware.devopen import DeviceOpen, rules_allow

PCI, DRIVER, MODULE, FILES, USER, NVML = (
    "PCI bus", "kernel driver", "nvidia module", "device files", "user-space driver", "NVML")


def _grouped(drops: list[Drop]) -> tuple[Drop, ...]:
    """One drop per cause, naming all its GPUs."""
    merged: dict[tuple[str, str, bool, bool], list[str]] = {}
    for drop in drops:
        merged.setdefault((drop.cause, drop.fix, drop.known, drop.intended), []).extend(drop.gpus)
    return tuple(Drop(tuple(gpus), cause, fix, known, intended)
                 for (cause, fix, known, intended), gpus in merged.items())


def _layer(name: str, below: Passing, own: tuple[str, ...], facts: list[str],
           drops: list[Drop]) -> Layer:
    extra = [g for g in own if below is not None and g not in below]
    if extra:
        facts.append(f"also lists {', '.join(extra)}, which the layer below did not show")
    return Layer(name, own, len(own), tuple(facts), _grouped(drops))


def pci_bus(facts: Facts, below: Passing) -> Layer:
    pci = facts.host.nvidia.pci
    if not pci.ok or pci.value is None:
        return unknown(PCI, f"/sys/bus/pci not read ({pci.error or 'not probed'})")
    if not pci.value:
        # WSL2 and some virtual machines show the GPU without its PCI function.
        return unknown(PCI, "no NVIDIA display/3D function in /sys/bus/pci/devices")
    ids = tuple(g.bus_id for g in pci.value)
    return Layer(PCI, ids, len(ids), (f"NVIDIA display/3D functions: {', '.join(ids)}",))


def kernel_driver(facts: Facts, below: Passing) -> Layer:
    pci = facts.host.nvidia.pci.value
    if not pci:
        return unknown(DRIVER, "no PCI function to look at")
    own, drops = [], []
    for gpu in pci:
        meaning = pcibus.driver_meaning(gpu.driver, gpu)
        if meaning.usable:
            own.append(gpu.bus_id)
        else:
            drops.append(Drop((gpu.bus_id,), meaning.cause, meaning.fix))
    bound = ", ".join(f"{g.bus_id}: {g.driver or 'none'}" for g in pci)
    return _layer(DRIVER, below, tuple(own), [f"bound drivers: {bound}"], drops)


def nvidia_module(facts: Facts, below: Passing) -> Layer:
    probed = facts.host.nvidia.module
    if not probed.ok:
        return unknown(MODULE, f"/proc/driver/nvidia not read ({probed.error})")
    module = probed.value
    if module is None:
        return unknown(MODULE, "no /proc/driver/nvidia/version: the module is not "
                                      "loaded, or /proc hides it")
    listed = {g.bus_id: g for g in module.gpus}
    own = tuple(b for b, g in listed.items() if not g.hidden)
    said = [f"nvidia {module.version} ({module.flavour} kernel module) lists "
            f"{', '.join(listed) or 'no GPU'}"]
    drops = [Drop((b,), "hidden from this container by the NVIDIA runtime: it was not given "
                  "to it", intended=True) for b, g in listed.items() if g.hidden]
    missing = tuple(b for b in below or () if b not in listed)
    if missing:
        if module.flavour == "open":
            drops.append(Drop(missing, "bound to nvidia, but the open kernel module did not "
                              "attach it: the open flavour supports Turing and later GPUs only",
                              "install the proprietary flavour of the same driver (the "
                              "`nvidia-driver-<branch>` package, not `-open`), then reboot"))
        else:
            drops.append(between(DRIVER, MODULE, missing, tuple(said)))
    return _layer(MODULE, below, own, said, drops)


def _minors(facts: Facts) -> dict[str, int]:
    module = facts.host.nvidia.module.value
    return {g.bus_id: g.minor for g in (module.gpus if module else ()) if g.minor is not None}


def _given_elsewhere(facts: Facts, minor: int | None, opened: int) -> str | None:
    """The assignment that leaves this GPU to another job (its device file then fails):
    Slurm's by the minor; a container's (host indices or UUIDs, which the files do not
    carry) when as many files opened as it lists."""
    for found in assignment.read(facts.environ, in_container=bool(facts.host.in_container.value)):
        if found.ids is None or found.error is not None or found.numbering == "visible":
            continue
        if found.numbering == "host" and opened >= len(found.ids):
            return found.said
        if found.numbering == "minor" and minor is not None and str(minor) not in found.ids:
            return found.said
    return None


def _explain(facts: Facts, opened: DeviceOpen, minor: int | None,
             opened_count: int = 0) -> openerrors.OpenCause:
    nvidia = facts.host.nvidia
    who = nvidia.identity.value
    rules = nvidia.device_rules.value
    refused = (rules is not None and minor is not None and not rules_allow(rules, minor))
    context = openerrors.OpenContext(
        path=f"/dev/{opened.name}", mode=opened.mode,
        group=opened.group, uid=who.uid if who else os.geteuid(),
        groups=nvidia.groups.value or (),
        mode_allows=opened.mode_allows, in_container=bool(facts.host.in_container.value),
        given_elsewhere=(_given_elsewhere(facts, minor, opened_count) if minor is not None
                         else None),
        rules="; ".join(rules) if refused and rules else None,
        module_loaded=nvidia.module.value is not None)
    return openerrors.explain(opened.errno or 0, context)


def device_files(facts: Facts, below: Passing) -> Layer:
    probed = facts.host.nvidia.opens
    if not probed.ok or probed.value is None or below is None:
        return unknown(FILES, f"device files not opened ({probed.error or 'no GPU'})")
    opens = {o.name: o for o in probed.value}
    said = [", ".join(f"/dev/{o.name} {'opens' if o.errno is None else 'fails'}"
                      for o in probed.value)]
    drops: list[Drop] = []
    for shared in ("nvidiactl", "nvidia-uvm"):
        opened = opens.get(shared)
        if opened is not None and opened.errno is not None and below and not drops:
            why = _explain(facts, opened, None)
            need = "NVML and CUDA need" if shared == "nvidiactl" else "CUDA needs"
            drops.append(Drop(below, f"{why.cause} ({need} it for every GPU)", why.fix))
    if drops:
        return _layer(FILES, below, (), said, drops)
    own, minors = [], _minors(facts)
    opened_count = sum(1 for o in probed.value
                       if o.name[6:].isdigit() and o.errno is None)
    for bus in below:
        opened = opens.get(f"nvidia{minors[bus]}") if bus in minors else None
        if opened is None or opened.errno is None:
            own.append(bus)
            continue
        why = _explain(facts, opened, minors[bus], opened_count)
        drops.append(Drop((bus,), why.cause, why.fix, intended=why.intended))
    return _layer(FILES, below, tuple(own), said, drops)


_LIBCUDA_VERSION = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")


def user_space(facts: Facts, below: Passing) -> Layer:
    nvidia, module = facts.host.nvidia, facts.host.nvidia.module.value
    said, problems = [], []
    nvml_version = nvidia.nvml_library_version
    if nvidia.nvml_library.value:
        said.append(f"libnvidia-ml: {nvidia.nvml_library.value}")
    api = facts.cuda_driver.value if facts.cuda_driver is not None else None
    libcuda = api.library if api is not None else None
    if libcuda:
        said.append(f"libcuda.so.1: {libcuda}")
    match = _LIBCUDA_VERSION.search(os.path.basename(libcuda or ""))
    for what, version in (("libnvidia-ml", nvml_version),
                          ("libcuda.so.1", match.group(1) if match else None)):
        if module is not None and version and version != module.version:
            problems.append(f"{what} is {version}, the kernel module {module.version}")
    if api is not None and api.library is None and api.load_error:
        problems.append(f"libcuda.so.1 does not load ({api.load_error})")
    if below is None:
        return unknown(USER, "; ".join(said) or "no GPU below to carry")
    drops = []
    if problems:
        mismatch = any("kernel module" in p for p in problems)
        drops.append(Drop(below, "the user-space driver does not match: " + "; ".join(problems),
                          cudaerrors.FIX_DRIVER_MISMATCH if mismatch else
                          "install the NVIDIA driver's libraries (in a container: "
                          "NVIDIA_DRIVER_CAPABILITIES=compute,utility and `--gpus`)"))
    return _layer(USER, below, () if problems else below, said, drops)


def nvml(facts: Facts, below: Passing) -> Layer:
    listing = facts.nvml.listing
    if not listing.available:
        drops = [Drop(below, f"NVML does not start: {listing.error}",
                      "see the Driver (NVML) line")] if below else []
        return Layer(NVML, (), 0, (f"NVML: {listing.error}",), tuple(drops))
    by_bus = {pcibus.short_bus_id(g.pci_bus_id.value): g for g in listing.gpus
              if g.pci_bus_id.ok and g.pci_bus_id.value}
    own = tuple(by_bus) + tuple(f"NVML GPU {g.index}" for g in listing.gpus
                                if g not in by_bus.values())
    said = [f"NVML lists {len(listing.gpus)}: {', '.join(own) or 'none'}"]
    # Each one's state, as the GPU lines judge it: MIG, a compute mode other than default.
    said += [f"GPU {g.index}: MIG on" for g in listing.gpus if g.mig_enabled.value]
    said += [f"GPU {g.index}: compute mode {g.compute_mode.value}" for g in listing.gpus
             if g.compute_mode.ok and g.compute_mode.value not in (None, "default")]
    failed = {pcibus.short_bus_id(f.bus_id): f for f in listing.failed if f.bus_id}
    if below and len(listing.gpus) + len(listing.failed) == len(below):
        # NVML enumerates in PCI order: a GPU whose handle it refused is the one at its index.
        failed.update({sorted(below)[f.index]: f for f in listing.failed
                       if not f.bus_id and f.index < len(below)})
    drops = []
    for bus in (b for b in below or () if b not in by_bus):
        if bus in failed:
            drops.append(Drop((bus,), f"NVML cannot use it: {failed[bus].error}",
                              "see the GPU line for it"))
        else:
            drops.append(between(USER, NVML, (bus,), (
                *said, f"GPU(s) NVML could not open: {len(listing.failed)}")))
    return _layer(NVML, below, own, said, drops)


LAYERS: tuple[Step, ...] = (pci_bus, kernel_driver, nvidia_module, device_files, user_space,
                            nvml)
