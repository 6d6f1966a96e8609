"""One run per folder (`training.run.hold`): a real POSIX lock held by a real process, no
TensorFlow. A second start is refused naming the holder; a kill -9 frees the folder at
once; a launcher's workers go on under its hold; a file system without locks is said."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.run.hold import HELD_BY_ENV, HOLDER_FILE, hold_run_folder, read_holder
from tests.support.children import child_env

# A process that holds the folder and says so, then waits (a start of mgpu train, as far
# as the folder can tell).
HOLDER = """
import sys, time
from pathlib import Path
from mgpu_env.training.run.hold import hold_run_folder
hold = hold_run_folder(Path(sys.argv[1]), argv=["mgpu", "train"])
print("held", flush=True)
time.sleep(600)
"""


def start_holder(folder: Path, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)],
                               env={**child_env(tmp_path), **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().strip() == "held", process.stderr.read()
    return process


def test_a_second_start_is_refused_naming_the_holder_and_a_kill_frees_it_at_once(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "run"
    holder = start_holder(folder, tmp_path)
    try:
        with pytest.raises(ConfigError) as caught:
            hold_run_folder(folder)
        message = str(caught.value)
        assert caught.value.exit_code == 2
        assert f"pid {holder.pid} on {socket.gethostname()}, since " in message
        assert "(mgpu train)" in message and f"`kill {holder.pid}`" in message
        assert "another RUN_NAME or OUTPUT_DIR" in message
        # kill -9: the kernel drops the lock; the next start takes it with no manual step,
        # over the dead holder's record.
        holder.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        holder.wait()
        while True:
            try:
                hold = hold_run_folder(folder)
                break
            except ConfigError:
                assert time.monotonic() - killed < 5, "the lock outlived its holder"
                time.sleep(0.001)
        took = time.monotonic() - killed
        assert took < 1.0, took
        record = read_holder(folder)
        assert record is not None and record.pid == os.getpid()
        hold.release()
        assert not (folder / HOLDER_FILE).exists()  # a clean end leaves no record
    finally:
        holder.kill()
        holder.wait()


def test_the_launchers_workers_go_on_under_its_hold_and_no_one_else(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    check = textwrap.dedent("""
        import sys
        from pathlib import Path
        from mgpu_env.config.errors import ConfigError
        from mgpu_env.training.run.hold import hold_run_folder
        try:
            hold = hold_run_folder(Path(sys.argv[1]))
            print("went on:", "; ".join(hold.notes))
        except ConfigError as err:
            print("refused:", str(err).splitlines()[0])
    """)
    with hold_run_folder(folder):
        def worker(**env: str) -> str:
            return subprocess.run([sys.executable, "-c", check, str(folder)],
                                  env={**child_env(tmp_path), **env}, capture_output=True,
                                  text=True, timeout=60, check=True).stdout.strip()

        assert worker(**{HELD_BY_ENV: str(os.getpid())}) == (
            f"went on: the run folder is held by the launcher, pid {os.getpid()}")
        # Another process naming some other pid, or none, is refused.
        assert worker(**{HELD_BY_ENV: "1"}).startswith("refused: ")
        assert worker().startswith(f"refused: OUTPUT_DIR={folder} is held by another start")


# fcntl(2) answering ENOLCK, as NFS mounted `nolock` and Lustre without `-o flock` do.
NO_LOCKS_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <dlfcn.h>
int fcntl(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    if (cmd == F_SETLK || cmd == F_SETLKW || cmd == F_GETLK || cmd == F_OFD_SETLK) {
        errno = ENOLCK; return -1;
    }
    int (*real)(int, int, ...) = dlsym(RTLD_NEXT, "fcntl");
    return real(fd, cmd, arg);
}
int fcntl64(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    return fcntl(fd, cmd, arg);
}
"""


@pytest.fixture
def no_locks(tmp_path: Path) -> Path:
    source = tmp_path / "nolocks.c"
    source.write_text(NO_LOCKS_C)
    library = tmp_path / "nolocks.so"
    try:
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"needs gcc to build a file system without locks: {err}")
    return library


def test_a_file_system_without_locks_is_said_and_a_live_holder_still_refuses(
    tmp_path: Path, no_locks: Path,
) -> None:
    folder = tmp_path / "run"
    env = {"LD_PRELOAD": str(no_locks)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.replace('print("held"', 'print("held", *hold.notes'),
         str(folder)], env={**child_env(tmp_path), **env}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.startswith("held ") and "takes no locks (ENOLCK" in line, line
        assert "Lustre: `-o flock`" in line
        second = subprocess.run(
            [sys.executable, "-c", HOLDER, str(folder)], env={**child_env(tmp_path), **env},
            capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert f"is held by another start of mgpu train: pid {holder.pid}" in second.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_start_refused_before_writing_leaves_no_folder_it_made(tmp_path: Path) -> None:
    made = tmp_path / "runs" / "new"
    hold_run_folder(made).release()
    assert not made.exists()  # bad data or a GPU too small: as if it never started
    kept = tmp_path / "kept"
    kept.mkdir()
    hold_run_folder(kept).release()
    assert kept.is_dir()  # the user's folder (or a run's) stays, emptied of the hold only
    written = tmp_path / "written"
    hold = hold_run_folder(written)
    (written / "run.json").write_text("{}")
    hold.release()
    assert sorted(p.name for p in written.iterdir()) == ["run.json", "run.lock"]
