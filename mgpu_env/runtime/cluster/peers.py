"""Can this worker reach the others? Asked before TensorFlow waits on them.

TensorFlow's collective service waits for every peer until WORKER_TIMEOUT and then says
little about which one failed or why. Two cheap probes say more, per peer: does its host
name resolve (a Kubernetes Service whose pods are not up yet, a wrong node name), and does
a TCP connection to its port get an answer within a short timeout. A refused connection
means the host answered and nothing listens there yet (the worker has not started, or
WORKER_PORT differs); silence until the timeout means something drops the packets (a
firewall, a NetworkPolicy, a wrong address).

The probes are small functions the tests replace (`resolve`, `connect`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mgpu_env.runtime.cluster.model import Cluster

PeerState = Literal["ok", "unresolved", "refused", "silent", "self"]
CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PeerStatus:
    address: str  # host:port
    state: PeerState
    detail: str = ""

    @property
    def reachable(self) -> bool:
        return self.state in ("ok", "self")


def resolve(host: str) -> str | None:
    """The host's first address, or None when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    return str(infos[0][4][0]) if infos else None


def connect(ip: str, port: int, timeout: float) -> Literal["ok", "refused", "silent"]:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        # A timeout, or "no route to host": either way no answer came back.
        return "silent"


def probe_peers(
    workers: Sequence[str],
    own_address: str,
    *,
    timeout: float = CONNECT_TIMEOUT_S,
    resolver: Callable[[str], str | None] = resolve,
    connector: Callable[[str, int, float], str] = connect,
) -> list[PeerStatus]:
    """Each peer's state (this worker's own address is "self", not probed)."""
    statuses = []
    for address in workers:
        if address == own_address:
            statuses.append(PeerStatus(address, "self"))
            continue
        host, _, port = address.rpartition(":")
        ip = resolver(host)
        if ip is None:
            statuses.append(PeerStatus(address, "unresolved", f"{host} does not resolve"))
            continue
        state = connector(ip, int(port), timeout)
        statuses.append(PeerStatus(address, state, ip))  # type: ignore[arg-type]
    return statuses


def wait_until_resolved(
    cluster: Cluster,
    deadline_s: float,
    *,
    resolver: Callable[[str], str | None] = resolve,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Wait (up to `deadline_s`) until every peer's host resolves; the ones that never did.

    Pods of one Kubernetes job start at different times, and a peer's DNS name exists only
    once its pod does: waiting is normal, waiting forever is not.
    """
    hosts = sorted({a.rpartition(":")[0] for a in cluster.workers if a != cluster.address})
    end = clock() + deadline_s
    while True:
        missing = [h for h in hosts if resolver(h) is None]
        if not missing or clock() >= end:
            return missing
        sleep(min(2.0, max(0.0, end - clock())))


def explain(statuses: Sequence[PeerStatus], engine: str, port_setting: str) -> list[str]:
    """One line per unreachable peer, with the likely fix for this engine."""
    lines = []
    for status in statuses:
        if status.reachable:
            continue
        if status.state == "unresolved":
            fix = {
                "kubernetes": "the headless Service (K8S_SERVICE) is missing or its pods are "
                "not up yet; check `kubectl get pods,svc` and publishNotReadyAddresses",
                "slurm": "the node name Slurm gave does not resolve on this node; check "
                "/etc/hosts or DNS on the compute nodes",
            }.get(engine, "check the host name in the cluster settings")
            lines.append(f"{status.address}: {status.detail}; {fix}")
        elif status.state == "refused":
            lines.append(
                f"{status.address}: the host ({status.detail}) answered but nothing listens on "
                f"the port yet: that worker has not started, or it uses another port "
                f"({port_setting} must be the same on every worker)")
        elif status.state == "silent":
            lines.append(
                f"{status.address}: no answer from {status.detail} within "
                f"{CONNECT_TIMEOUT_S:.0f} s: a firewall or network policy drops the traffic, "
                "or the address is wrong")
    return lines
