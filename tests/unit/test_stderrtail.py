"""Stderr's tail (`stderrtail`), run for real: a process whose fd 2 goes through the helper,
written to by C (libc's write), by os.write and by Python's sys.stderr, then by a child that
outlives the tail. Everything reaches the real stderr, in order; the tail keeps the last
lines, an unfinished one included."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.children import REPO

WRITER = """
import ctypes, json, os, subprocess, sys
from mgpu_env.training.multiworker.stderrtail import StderrTail

libc = ctypes.CDLL(None)
tail = StderrTail(os.dup(2), 5)
for i in range(30):
    line = f"line {i}\\n".encode()
    if i % 3 == 0:
        libc.write(2, line, len(line))
    elif i % 3 == 1:
        os.write(2, line)
    else:
        sys.stderr.write(line.decode())
os.write(2, b"unfinished")
kept = tail.lines()
child = subprocess.Popen([sys.executable, "-c",
                          "import sys, time; time.sleep(1); sys.stderr.write(' and a child')"])
tail.stop()
sys.stderr.write("\\nafter the tail\\n")
child.wait()
print(json.dumps(kept))
"""


def test_everything_written_to_fd_2_reaches_stderr_in_order_and_the_last_lines_are_kept(
) -> None:
    result = subprocess.run([sys.executable, "-c", WRITER], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [f"line {i}" for i in range(25, 30)] + ["unfinished"]
    # The child's words came after the tail stopped (fd 2 of this process the real stderr
    # again), through the helper it still held.
    assert result.stderr == "".join(f"line {i}\n" for i in range(30)) + (
        "unfinished\nafter the tail\n and a child")
