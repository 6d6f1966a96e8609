"""NCCL's environment variables against this machine and NCCL's documented values.

NCCL reads its `NCCL_*` variables when the first communicator starts, which is the first
all-reduce: a value that names no interface of this machine ends there in NCCL's bootstrap
error ("Bootstrap : no socket interface found"), a misspelt name is silently ignored. This
module judges each variable before that:

- the interface lists (`NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`) by NCCL's own matching rules: a
  comma list of prefixes, `^` in front excludes, `=` in front matches names exactly, and for
  HCAs an optional `:port`; against /sys/class/net and /sys/class/infiniband;
- the variables with a fixed set of values (levels, protocols, algorithms, switches), from
  NCCL's "Environment Variables" page (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html);
- any other `NCCL_` name: unknown to NCCL, so likely a typo, with the closest known name.

Pure functions of the environment and the folder listings; `interfaces(root)` and
`hcas(root)` read the machine.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mgpu_env.hardware.hostroot import host_root

ON_OFF = ("0", "1")
LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")  # and the older integers 0..5
PROTOCOLS = ("LL", "LL128", "SIMPLE")
ALGORITHMS = ("RING", "TREE", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT")
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
DEBUG_SUBSYSTEMS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC",
                    "CALL", "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL")

# Variables with a closed set of values (upper-cased before comparing, as NCCL does).
CHOICES: dict[str, tuple[str, ...]] = {
    "NCCL_P2P_LEVEL": (*LEVELS, "0", "1", "2", "3", "4", "5"),
    "NCCL_NET_GDR_LEVEL": (*LEVELS, "0", "1", "2", "3", "4", "5"),
    "NCCL_DEBUG": DEBUG_LEVELS,
    "NCCL_SOCKET_FAMILY": ("AF_INET", "AF_INET6"),
    "NCCL_CROSS_NIC": ("0", "1", "2"),
    "NCCL_IB_ADDR_FAMILY": ("AF_INET", "AF_INET6"),
}
SWITCHES = (
    "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET_GDR_READ",
    "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE", "NCCL_P2P_USE_CUDA_MEMCPY",
    "NCCL_P2P_NVL_CHUNKSIZE_ENABLE", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_COLLNET_ENABLE",
    "NCCL_CHECK_POINTERS", "NCCL_LAUNCH_MODE_GROUP", "NCCL_GRAPH_MIXING_SUPPORT",
    "NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_IB_ADAPTIVE_ROUTING", "NCCL_IB_ECE_ENABLE",
    "NCCL_MNNVL_ENABLE", "NCCL_RAS_ENABLE", "NCCL_NVLSTREE_MAX_CHUNKSIZE_ENABLE",
    "NCCL_SET_THREAD_NAME", "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_RUNTIME_CONNECT",
    "NCCL_NET_SHARED_BUFFERS", "NCCL_NET_SHARED_COMMS", "NCCL_PXN_DISABLE",
    "NCCL_IB_MERGE_NICS", "NCCL_P2P_READ_ENABLE", "NCCL_SHM_USE_CUDA_MEMCPY",
    "NCCL_NVLS_DISABLE", "NCCL_ENABLE_CUDA_GDR",
)
# Names NCCL documents whose values are free (numbers, paths, lists): known, not judged here.
OTHER_KNOWN = (
    "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_PROTO", "NCCL_ALGO", "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE", "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC", "NCCL_COMM_ID", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT",
    "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_RANGE", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_SL",
    "NCCL_IB_TC", "NCCL_IB_FIFO_TC", "NCCL_IB_RETURN_ASYNC_EVENTS", "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_AR_THRESHOLD", "NCCL_IB_USE_INLINE", "NCCL_IB_CUDA_SUPPORT", "NCCL_IB_MQP_BUFFER",
    "NCCL_OOB_NET_ENABLE", "NCCL_OOB_NET_IFNAME", "NCCL_UID_STAGGER_THRESHOLD",
    "NCCL_UID_STAGGER_RATE", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN", "NCCL_NET_GDR_C2C", "NCCL_NET_DISABLE_INTRA", "NCCL_TOPO_FILE",
    "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_FILE", "NCCL_GRAPH_DUMP_FILE", "NCCL_BUFFSIZE",
    "NCCL_NTHREADS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_CTAS",
    "NCCL_MIN_CTAS", "NCCL_CGA_CLUSTER_SIZE", "NCCL_CONF_FILE", "NCCL_HOSTID",
    "NCCL_LAUNCH_MODE", "NCCL_LL_THRESHOLD", "NCCL_LL128_THRESHOLD", "NCCL_TREE_THRESHOLD",
    "NCCL_SINGLE_RING_THRESHOLD", "NCCL_COMM_BLOCKING", "NCCL_NVLS_NCHANNELS",
    "NCCL_NVB_DISABLE", "NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_P2P_PCI_CHUNKSIZE", "NCCL_PXN_C2C", "NCCL_MNNVL_UUID", "NCCL_MNNVL_CLIQUE_ID",
    "NCCL_WORK_FIFO_DEPTH", "NCCL_WORK_FIFO_BYTES", "NCCL_WIN_ENABLE", "NCCL_RAS_ADDR",
    "NCCL_RAS_TIMEOUT_FACTOR", "NCCL_CUMEM_HOST_ENABLE", "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT", "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_CROSS_NIC",
    "NCCL_ALGO_THRESHOLD", "NCCL_SHARP_DISABLE", "NCCL_COLLNET_NODE_THRESHOLD",
    "NCCL_NET_PLUGIN_REF_COUNT", "NCCL_IGNORE_DISABLED_P2P", "NCCL_NET_OVERHEAD",
    "NCCL_NET_MERGE_LEVEL", "NCCL_NET_FORCE_MERGE", "NCCL_IB_MERGE_VFS", "NCCL_RINGS",
    "NCCL_TREES", "NCCL_SHM_LOCALITY", "NCCL_SHM_MEMCPY_MODE", "NCCL_L1_SHARED_MEMORY_CARVEOUT",
    "NCCL_PROGRESS_APPENDOP_FREQ", "NCCL_PROXY_APPEND_BATCH_SIZE", "NCCL_CREATE_THREAD_CONTEXT",
    "NCCL_DMABUF_ENABLE", "NCCL_REPORT_CONNECT_PROGRESS", "NCCL_NVLS_CHUNKSIZE",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS", "NCCL_LOCAL_REGISTER", "NCCL_GRAPH_REGISTER",
    "NCCL_LEGACY_CUDA_REGISTER", "NCCL_SHM_SIZE",
)
KNOWN = frozenset((*CHOICES, *SWITCHES, *OTHER_KNOWN))
# Protocol and algorithm lists: a comma list, `^` in front excludes; since NCCL 2.24 a
# per-collective form `allreduce:tree,ring;broadcast:ring` too.
LISTS: dict[str, tuple[str, ...]] = {"NCCL_PROTO": PROTOCOLS, "NCCL_ALGO": ALGORITHMS,
                                     "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYSTEMS}


@dataclass(frozen=True)
class Finding:
    """One NCCL variable judged: `error` breaks the first all-reduce, `warn` is suspect."""

    name: str
    value: str
    status: str  # "error" or "warn"
    problem: str
    fix: str


@dataclass(frozen=True)
class Matcher:
    """NCCL_SOCKET_IFNAME / NCCL_IB_HCA parsed as NCCL parses them."""

    exclude: bool
    exact: bool
    names: tuple[str, ...]

    @classmethod
    def parse(cls, value: str) -> Matcher:
        text = value.strip()
        exclude = text.startswith("^")
        text = text.removeprefix("^")
        exact = text.startswith("=")
        text = text.removeprefix("=")
        # An HCA may name a port (mlx5_0:1): the port is not part of the device's name.
        names = tuple(n.strip().split(":")[0] for n in text.split(",") if n.strip())
        return cls(exclude, exact, names)

    def matches(self, device: str) -> bool:
        hit = any(device == n if self.exact else device.startswith(n) for n in self.names)
        return hit != self.exclude

    def chosen(self, devices: Iterable[str]) -> tuple[str, ...]:
        return tuple(d for d in devices if self.matches(d))


def listing(folder: Path) -> tuple[str, ...]:
    """The entries of a /sys/class folder; empty when it is not there."""
    return tuple(sorted(p.name for p in folder.iterdir())) if folder.is_dir() else ()


def interfaces(root: Path | None = None) -> tuple[str, ...]:
    return listing((root or host_root()) / "sys/class/net")


def hcas(root: Path | None = None) -> tuple[str, ...]:
    return listing((root or host_root()) / "sys/class/infiniband")


def _devices(name: str, value: str, devices: tuple[str, ...], kind: str,
             folder: str) -> Finding | None:
    matcher = Matcher.parse(value)
    if not matcher.names:
        return Finding(name, value, "error", f"names no {kind}",
                       f"unset {name}, or name one of this machine's: {', '.join(devices)}")
    chosen = matcher.chosen(devices)
    if chosen:
        return None
    have = ", ".join(devices) or "none"
    rule = ("excludes every one" if matcher.exclude else
            "matches none (`=` wants exact names)" if matcher.exact else "matches none")
    return Finding(name, value, "error",
                   f"{rule} of this machine's {kind}s ({folder}: {have}); NCCL stops at "
                   "the first all-reduce",
                   f"set {name} to one of {have} (a prefix, `=name` for exactly it, `^name` to "
                   f"leave it out), or unset it")


def _choice(name: str, value: str, valid: tuple[str, ...]) -> Finding | None:
    if value.strip().upper() in valid:
        return None
    return Finding(name, value, "error", f"not a value NCCL knows (valid: {', '.join(valid)})",
                   f"set {name} to one of {', '.join(valid)}, or unset it")


def _list(name: str, value: str, valid: tuple[str, ...]) -> Finding | None:
    unknown = []
    for part in value.split(";"):
        items = part.rpartition(":")[2].strip().removeprefix("^")
        unknown += [i for i in (x.strip() for x in items.split(",")) if i
                    and i.upper() not in valid]
    if not unknown:
        return None
    return Finding(name, value, "error", f"{', '.join(unknown)}: not a value NCCL knows "
                   f"(valid: {', '.join(valid)}; `^` in front excludes)",
                   f"fix {name} (one or more of {', '.join(valid)}), or unset it")


def judge(environ: Mapping[str, str], net: tuple[str, ...], ib: tuple[str, ...]) -> list[Finding]:
    """Every `NCCL_*` variable of `environ` that is wrong for this machine or for NCCL."""
    findings: list[Finding | None] = []
    for name in sorted(n for n in environ if n.startswith("NCCL_")):
        value = environ[name]
        if name == "NCCL_SOCKET_IFNAME":
            findings.append(_devices(name, value, net, "network interface", "/sys/class/net"))
        elif name == "NCCL_IB_HCA":
            ib_off = environ.get("NCCL_IB_DISABLE", "0").strip() == "1"
            findings.append(None if ib_off else _devices(
                name, value, ib, "InfiniBand adapter", "/sys/class/infiniband"))
        elif name in CHOICES:
            findings.append(_choice(name, value, CHOICES[name]))
        elif name in SWITCHES:
            findings.append(_choice(name, value, ON_OFF))
        elif name in LISTS:
            findings.append(_list(name, value, LISTS[name]))
        elif name not in KNOWN:
            close = difflib.get_close_matches(name, sorted(KNOWN), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}? " if close else ""
            findings.append(Finding(name, value, "warn",
                                    "not a variable NCCL knows: it is ignored (a typo?)",
                                    f"{hint}see NCCL's environment variables "
                                    "(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)"))
    return [f for f in findings if f is not None]
