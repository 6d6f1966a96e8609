"""The chain from the PCI bus to TensorFlow (`doctor.chain`), judged.

One line with the count at every layer, one error for each drop nobody asked for (its GPUs, its
layer, its cause and fix), and the job's warnings (other processes' memory, a container seeing
more than it was given). `ready` needs the counts to agree for the GPUs training will use."""

from __future__ import annotations

from mgpu_env.doctor.chain import Chain, build
from mgpu_env.doctor.chainlower import NVML
from mgpu_env.doctor.chainupper import CUDA, TF
from mgpu_env.doctor.checks.common import Check, CheckId, Status, check, no_gpu, wants_gpus
from mgpu_env.doctor.facts import Facts

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
CHAIN = CheckId("chain")
CHAIN_JOB = CheckId("chain.job")

TITLE = "GPU chain"
EXPECTED = "every GPU the job uses passes every layer, from the PCI bus to TensorFlow"
# Layers whose drops a line of their own already reports with its cause and fix (the Driver
# (NVML) line, the CUDA driver line, the TensorFlow GPUs line): the chain's line counts them
# and points there, and is not counted again (one cause, one error).
REPORTED_ELSEWHERE = {NVML: "the Driver (NVML) line", CUDA: "the CUDA driver line",
                      TF: "the TensorFlow GPUs line"}


def _summary(chain: Chain) -> str:
    read = [layer for layer in chain.layers if layer.read]
    if all(layer.count == 0 for layer in read):
        return "no NVIDIA GPU at any layer (the PCI bus, the nvidia module and NVML show none)"
    counts = chain.counts()
    given = [f"{len(d.gpus)} {d.cause}" for layer in chain.layers for d in layer.drops
             if d.intended]
    text = counts + (f" ({'; '.join(given)})" if given else "")
    for layer, drop in chain.faults:
        if layer.name in REPORTED_ELSEWHERE:
            text += (f"; {len(drop.gpus)} lost at {layer.name}: see "
                     f"{REPORTED_ELSEWHERE[layer.name]}")
    unread = chain.unread()
    return text + (f"; not read here: {', '.join(unread)}" if unread else "")


@check(5, CHAIN)
def check_chain(facts: Facts) -> list[Check]:
    """The chain's counts, and each fault in it as an error (a warning where GPUS=none)."""
    chain = build(facts)
    faults = chain.faults
    if not faults and all(layer.count == 0 for layer in chain.layers if layer.read):
        return [CHAIN(TITLE, "skip", _summary(chain), EXPECTED,
                      skipped_for=no_gpu(facts))]
    status: Status = "error" if wants_gpus(facts) else "warn"
    own = [(layer, drop) for layer, drop in faults if layer.name not in REPORTED_ELSEWHERE]
    if faults and not own:
        return [CHAIN(TITLE, "skip", _summary(chain) + " (counted on those lines)",
                      EXPECTED), *_warnings(chain)]
    results = [CHAIN(TITLE, status if faults else "ok", _summary(chain), EXPECTED,
                     "each `GPUs lost at ...` line names the GPUs, the cause and the fix"
                     if faults else "")]
    seen: dict[str, int] = {}
    for layer, drop in own:
        where = layer.name.replace(" ", "-").lower()
        seen[where] = seen.get(where, 0) + 1
        where += f".{seen[where]}" if seen[where] > 1 else ""
        title = f"GPUs lost at {layer.name}"
        results.append(CHAIN.child(where)(title, status,
                                   f"{', '.join(drop.gpus)}: {drop.cause}", EXPECTED, drop.fix))
    return results + _warnings(chain)


def _warnings(chain: Chain) -> list[Check]:
    return [CHAIN_JOB("GPUs of this job", "warn", text, "the job's GPUs to itself")
            for text in chain.warnings]
