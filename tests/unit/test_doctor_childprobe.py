"""The probe-child protocol, once for tfprobe, cudalibs, cudadriver and the smoke job: real
Python children that answer, stay silent, fail, hang (with a helper of their own), or stall
in a phase."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mgpu_env.hardware import childprobe

MARKER = "TEST_JSON "


def _run(code: str, timeout_s: float = 20, **kwargs: object) -> childprobe.ChildAnswer:
    return childprobe.ask([sys.executable, "-c", code], {"PATH": os.environ["PATH"]},
                          marker=MARKER, timeout_s=timeout_s, **kwargs)  # type: ignore[arg-type]


def test_the_last_marked_line_is_the_answer() -> None:
    done = _run(f"print('noise'); print({MARKER!r} + '1'); print({MARKER!r} + '2')")
    assert done.answer == "2" and done.returncode == 0 and not done.timed_out


def test_no_answer_keeps_stderrs_tail() -> None:
    done = _run("import sys; sys.stderr.write('a\\nb\\nc\\nd\\n'); sys.exit(3)")
    assert done.answer is None and done.returncode == 3
    assert done.exited("the probe") == "the probe exited with code 3: b | c | d"
    assert done.tail(1) == "d"


def test_a_child_that_cannot_start() -> None:
    done = childprobe.ask(["/no/such/python"], {}, marker=MARKER, timeout_s=5)
    assert done.answer is None and done.start_error is not None
    assert done.start_error.startswith("could not start Python:")


def test_a_hung_child_and_its_helper_are_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "helper.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); "
            f"print({MARKER!r} + 'early', flush=True); time.sleep(60)")
    start = time.monotonic()
    done = _run(code, timeout_s=1.5)
    assert done.timed_out and done.answer is None and time.monotonic() - start < 15
    helper = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{helper}").exists() or \
        Path(f"/proc/{helper}/stat").read_text().split()[2] == "Z"


def test_a_phase_without_progress_is_a_hang() -> None:
    code = ("import sys, time; sys.stderr.write('PHASE start\\n'); sys.stderr.flush(); "
            "time.sleep(0.1); sys.stderr.write('PHASE all-reduce\\n'); sys.stderr.flush(); "
            "time.sleep(60)")
    done = _run(code, timeout_s=30,
                phases=childprobe.PhaseWatch("PHASE ", 0.5, ("all-reduce",)))
    assert done.timed_out and done.hung_in == "all-reduce"
