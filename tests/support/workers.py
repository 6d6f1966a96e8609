"""Two `mgpu train` workers on 127.0.0.1, each its own process as on two machines, with
separate OUTPUT_DIRs (nothing shared); every wait is bounded and every process killed on the
way out."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.children import child_env

RUN_TIMEOUT_S = 240
WORKER_TIMEOUT_S = "40"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def worker_env(tmp_path: Path, hosts: str, index: int, **settings: str) -> dict[str, str]:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return child_env(tmp_path / "home", **{
        "TF_CPP_MIN_LOG_LEVEL": "2", "GPUS": "none", "DATASET": "digits", "QUIET": "1",
        "BATCH_SIZE": "16", "EPOCHS": "2", "WORKER_HOSTS": hosts, "WORKER_INDEX": str(index),
        "WORKER_TIMEOUT": WORKER_TIMEOUT_S, "OUTPUT_DIR": str(tmp_path / f"out{index}"),
        "TMPDIR": str(scratch),  # where non-chief workers put their scratch checkpoints
        **settings,
    })


@contextmanager
def two_workers(tmp_path: Path, **settings_per_worker: dict[str, str]) -> Iterator[
    list[subprocess.Popen[str]]
]:
    """Start worker 0 (the chief) and worker 1; kill whatever still runs on the way out."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    processes = []
    try:
        for index in (0, 1):
            log = (tmp_path / f"worker{index}.log").open("w")
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "entrypoint", "train"],
                    env=worker_env(tmp_path, hosts, index,
                                   **settings_per_worker.get(f"w{index}", {})),
                    cwd=tmp_path,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


def log_of(tmp_path: Path, index: int) -> str:
    return (tmp_path / f"worker{index}.log").read_text()


def wait_all(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> list[int]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"workers did not finish in {RUN_TIMEOUT_S} s:\n"
                        + "\n".join(log_of(tmp_path, i)[-3000:] for i in (0, 1)))
    return [p.returncode for p in processes]
