
"""`mgpu run` (or another command) in a real process: scripts written to a test's folder,
no GPUs, an empty Keras cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.children import child_env

TIMEOUT_S = 300


def run_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    return child_env(tmp_path / "home", **{
        "TF_CPP_MIN_LOG_LEVEL": "2", "GPUS": "none", "QUIET": "1", **settings,
    })


def finish(workers: list[subprocess.Popen[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Each worker's result, in order; every worker is killed if one overruns TIMEOUT_S."""
    results = []
    try:
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=TIMEOUT_S)
            results.append(subprocess.CompletedProcess(worker.args, worker.returncode,
                                                       stdout, stderr))
    finally:
        for worker in workers:
            worker.kill()
    return results


def start(tmp_path: Path, args: list[str], command: str = "run",
          **settings: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", command, *args],
        env=run_env(tmp_path, **settings), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def mgpu(tmp_path: Path, args: list[str], command: str = "run",
         **settings: str) -> subprocess.CompletedProcess[str]:
    process = start(tmp_path, args, command, **settings)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        process.kill()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def seen(result: subprocess.CompletedProcess[str]) -> dict:
    """The last `SEEN {json}` line a probe script printed (what it saw of mgpu's choices)."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("SEEN ")]
    assert lines, f"stdout: {result.stdout}\nstderr: {result.stderr}"
    return json.loads(lines[-1][5:])
