"""The chain's job layers: the GPUs this job was given, GPUS, CUDA and TensorFlow.

The job's assignment (Slurm, Kubernetes, the container, CUDA_VISIBLE_DEVICES as the job
started) narrows what NVML lists; GPUS selects within it (by position, as
CUDA_VISIBLE_DEVICES composes); a GPU that GPUS reaches outside it is a fault. CUDA and
TensorFlow only count: each must see as many GPUs as GPUS selected.
"""

from __future__ import annotations

from collections.abc import Iterable

from mgpu_env.doctor.chaintypes import Drop, Layer, Passing, Step, between, unknown
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import assignment, cudaerrors, pcibus
from mgpu_env.hardware.assignment import Assignment
from mgpu_env.hardware.devices import visible_gpus
from mgpu_env.hardware.nvml import GpuInfo
from mgpu_env.tfprobes import tflog

JOB, GPUS, CUDA, TF = "this job", "GPUS", "CUDA", "TensorFlow"


def bus_of(gpu: GpuInfo) -> str:
    if gpu.pci_bus_id.ok and gpu.pci_bus_id.value:
        return pcibus.short_bus_id(gpu.pci_bus_id.value)
    return f"NVML GPU {gpu.index}"


def _assignments(facts: Facts) -> tuple[Assignment, ...]:
    return assignment.read(facts.environ, in_container=bool(facts.host.in_container.value))


def _by_host_ids(found: Assignment, facts: Facts) -> set[str]:
    """A container's ids (host indices, UUIDs) among what NVML lists here."""
    pci = [g.bus_id for g in facts.host.nvidia.pci.value or ()]
    chosen: set[str] = set()
    for item in found.ids or ():
        if item.isdigit():
            hosts = pci or [bus_of(g) for g in facts.gpus]
            if int(item) < len(hosts):
                chosen.add(hosts[int(item)])
        else:
            chosen |= {bus_of(g) for g in facts.gpus if g.uuid.lower().startswith(item.lower())}
    return chosen


def allowed(found: Assignment, facts: Facts) -> set[str] | None:
    """The bus ids `found` gives this job among NVML's GPUs; None: all of them."""
    if found.ids is None or found.error is not None:
        return None
    if found.numbering == "visible":
        return {bus_of(g) for g in visible_gpus(found.value, facts.gpus)}
    if len(facts.gpus) <= len(found.ids):
        return None  # the runtime or the job's cgroup already narrowed what NVML lists
    if found.numbering == "host":
        return _by_host_ids(found, facts)
    module = facts.host.nvidia.module.value
    minors = {g.bus_id: g.minor for g in (module.gpus if module else ())}
    return {bus_of(g) for g in facts.gpus
            if str(minors.get(bus_of(g), g.index)) in found.ids}


def job(facts: Facts, below: Passing) -> Layer:
    found = _assignments(facts)
    if below is None:
        return unknown(JOB, "no GPU below to give")
    if not found:
        return Layer(JOB, below, len(below), ("no scheduler, orchestrator or container "
                                               "assignment: every GPU is this job's",))
    own, drops = list(below), []
    for each in found:
        keep = allowed(each, facts)
        if keep is None:
            continue
        left = tuple(b for b in own if b not in keep)
        if left:
            drops.append(Drop(left, f"not given to this job ({each.source}: {each.said})",
                              intended=True))
        own = [b for b in own if b in keep]
    said = tuple(f"{a.source}: {a.said}" for a in found)
    return Layer(JOB, tuple(own), len(own), said, tuple(drops))


def gpus(facts: Facts, below: Passing) -> Layer:
    selection = facts.selection
    if selection is None:
        return unknown(GPUS, f"GPUS={facts.request} does not fit: "
                                    f"{facts.selection_error}")
    own = tuple(bus_of(g) for g in selection.gpus)
    said = [f"GPUS={facts.request}"] + ([selection.note] if selection.note else [])
    drops = []
    left = tuple(b for b in below or () if b not in own)
    if left:
        drops.append(Drop(left, f"left out by GPUS={facts.request}", intended=True))
    outside = tuple(b for b in own if below is not None and b not in below)
    if outside:
        given = "; ".join(f"{a.source}: {a.said}" for a in _assignments(facts))
        drops.append(Drop(outside, f"GPUS={facts.request} reaches GPUs this job was not "
                                   f"given ({given or 'or that failed a layer below'})",
                          "select within the job's GPUs: GPUS counts positions within "
                          "them (GPUS=0 is the job's first), or GPUS=all"))
        own = tuple(b for b in own if b not in outside)
    return Layer(GPUS, own, len(own), tuple(said), tuple(drops))


def _selected_labels(facts: Facts, count: int) -> tuple[str, ...]:
    labels = tuple(bus_of(g) for g in facts.selected)
    return labels[-count:] if count else ()


def cuda(facts: Facts, below: Passing) -> Layer:
    probed = facts.cuda_driver
    if probed is None or not probed.ok or probed.value is None or facts.selection is None:
        why = probed.error if probed is not None and probed.error else "not probed"
        return unknown(CUDA, f"CUDA's driver API: {why}")
    api, want = probed.value, len(facts.selected)
    said = (f"libcuda.so.1: {api.library or 'none'}; cuInit: "
            f"{cudaerrors.name(api.init_code) if api.init_code is not None else 'not called'}; "
            f"cuDeviceGetCount: {api.device_count}",)
    if api.library is None:
        drops = (Drop(_selected_labels(facts, want), f"libcuda.so.1 does not load: "
                      f"{api.load_error}", "see the CUDA driver line"),) if want else ()
        return Layer(CUDA, None, 0, said, drops)
    if api.init_code not in (None, 0):
        known = cudaerrors.describe(api.init_code or 0)
        drops = (Drop(_selected_labels(facts, want), f"cuInit failed with "
                      f"{cudaerrors.name(api.init_code or 0)}: {known.cause}", known.fix),
                 ) if want else ()
        return Layer(CUDA, None, 0, said, drops)
    if api.device_count is None:
        return unknown(CUDA, said[0])
    drops = ()
    if api.device_count < want:
        drops = (between(GPUS, CUDA, _selected_labels(facts, want - api.device_count),
                         (*said, "CUDA_VISIBLE_DEVICES="
                          f"{facts.selection.cuda_visible_devices}")),)
    return Layer(CUDA, None, api.device_count, said, drops)


def _tf_cause(facts: Facts, lost: tuple[str, ...], said: tuple[str, ...]) -> Drop:
    tf = facts.tensorflow
    assert tf is not None
    if not tf.gpus.ok:
        return Drop(lost, f"the TensorFlow probe gave no answer: {tf.gpus.error}",
                    "see the TensorFlow lines")
    explained = tflog.explain(tf.log)
    if explained is not None:
        return Drop(lost, explained[0], explained[1])
    log = tuple(tf.log) or ("TensorFlow's log held only start-up notices, which are not "
                            "causes",)
    return between(CUDA, TF, lost, said + log)


def tensorflow(facts: Facts, below: Passing) -> Layer:
    tf = facts.tensorflow
    if tf is None or facts.selection is None:
        return unknown(TF, "not probed (--no-tf)" if tf is None else "no selection")
    cuda_layer = cuda(facts, below)
    want = cuda_layer.count if cuda_layer.read else len(facts.selected)
    want = min(want or 0, len(facts.selected))
    have = tf.num_gpus
    said = (f"TensorFlow lists {have if have is not None else 'no answer'}",)
    if have is None or have < want:
        lost = _selected_labels(facts, want - (have or 0))
        return Layer(TF, None, have or 0, said, (_tf_cause(facts, lost, said),))
    return Layer(TF, None, have, said)


LAYERS: tuple[Step, ...] = (job, gpus, cuda, tensorflow)


def _holder(facts: Facts, pid: int, mib: int | None) -> str:
    """`python3 (pid 1000, 1024 MiB)`, or `pid 1000 (1024 MiB)` where /proc does not show it."""
    held = "? MiB" if mib is None else f"{mib} MiB"
    name = facts.process_names.get(pid)
    return f"{name} (pid {pid}, {held})" if name else f"pid {pid} ({held})"


def warnings(facts: Facts) -> Iterable[str]:
    """What does not drop a GPU but should be said: other processes' memory on the GPUs
    training will use, a container that sees more GPUs than it was given, CUDA seeing
    more than GPUS selected, an assignment that cannot be read."""
    for each in _assignments(facts):
        if each.error:
            yield each.error
        elif (each.numbering == "host" and each.ids is not None
              and len(facts.gpus) > len(each.ids)):
            yield (f"this container sees {len(facts.gpus)} GPUs but {each.said} gives it "
                   f"{len(each.ids)} (a --privileged container sees every GPU): training "
                   "keeps to the given ones; drop --privileged")
    for gpu in facts.selected:
        held = gpu.process_memory.value or ()
        if held:
            who = ", ".join(_holder(facts, pid, mib) for pid, mib in held)
            yield (f"GPU {gpu.index} ({bus_of(gpu)}): other processes hold memory on it: "
                   f"{who}; training shares it (`nvidia-smi` names them; choose other "
                   "GPUs with GPUS=...)")
    api = facts.cuda_driver.value if facts.cuda_driver is not None else None
    if (api is not None and api.device_count is not None and facts.selection is not None
            and api.device_count > len(facts.selected)):
        yield (f"CUDA sees {api.device_count} GPUs where GPUS selected "
               f"{len(facts.selected)}: CUDA_VISIBLE_DEVICES does not narrow it")
