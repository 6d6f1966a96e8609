"""The messages a user meets most: one line with the cause and the value, then the fix; no
TensorFlow or numpy internals. Each is provoked for real: a worker stuck where Python cannot
run, damaged files, a read-only mount, a folder given without its kind, a SIGTERM."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.parsers import SettingError, parse_dataset
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import SettingsErrors
from mgpu_env.hardware.folders import folder_access
from mgpu_env.training.input.data.files import load_files
from mgpu_env.training.input.data.sets import DatasetChoice
from mgpu_env.training.multiworker.backstop import probe, stuck_message
from mgpu_env.training.run.signals import Interrupted
from mgpu_env.training.shared.messages import plural, unwritable_folder
from tests.support.children import child_env
from tests.support.filedata import write_npy, write_tfrecords
from tests.support.runfolders import completed_epochs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ a peer that never joins

# A worker stuck while holding the GIL, as MultiWorkerMirroredStrategy's constructor is:
# a catastrophic regular expression runs in C and never lets the watchdog's thread in.
STUCK = """
import re, sys
from mgpu_env.training.multiworker.faults import Watchdog
peer = sys.argv[1]
dog = Watchdog(2, "worker 0 (127.0.0.1:1)", peers={{"worker 1": peer}}, tag="[worker 0] ")
dog.start(f"waiting for the other workers to join (worker 1 ({{peer}}))")
print("stuck", flush=True)
re.match(r"(a+)+$", "a" * 64 + "b")
"""


def _stuck_worker(peer: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", STUCK.format(), peer], capture_output=True, text=True,
        timeout=120, env=child_env(Path(tempfile.gettempdir())),
    )
    return result, time.monotonic() - started


@pytest.mark.slow
def test_a_peer_that_never_joins_is_named_without_a_thread_dump() -> None:
    peer = f"127.0.0.1:{_free_port()}"  # nothing listens there
    result, seconds = _stuck_worker(peer)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    waited = re.fullmatch(
        r"\[worker 0\] error: worker 0 \(127\.0\.0\.1:1\) waited (\d+) s for the other "
        rf"workers to join: worker 1 \({peer}\): nothing listens there \(not started yet, "
        r"or another port\)\.", lines[0])
    assert waited is not None, lines[0]
    assert 7 <= int(waited.group(1)) < 60  # WORKER_TIMEOUT, the grace, the helper's margin
    assert lines[1] == ("[worker 0]   Fix: start worker 1 with the same cluster settings, or "
                        "check that its address can be reached from here. WORKER_TIMEOUT=2 "
                        "(then 5 s of grace) sets how long a worker waits.")
    assert "Timeout" not in result.stderr and "Thread 0x" not in result.stderr
    # 2 s of WORKER_TIMEOUT, 5 s of grace: ended by the backstop, not by the test's timeout.
    assert seconds < 60


@pytest.mark.slow
def test_a_peer_that_listens_but_does_not_join_is_told_apart() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        peer = f"127.0.0.1:{listening.getsockname()[1]}"
        result, _ = _stuck_worker(peer)
    assert result.returncode == 1, result.stderr
    assert ("the other workers to join: every other worker's address answers, but the "
            "cluster did not go on.") in result.stderr
    assert "Thread 0x" not in result.stderr


# The same, under a worker's stall watch whose phase STALL_TIMEOUT bounds (WORKER_TIMEOUT,
# 60 s, caps it): its fd 2 goes through stderr's tail, which another process copies.
STUCK_WATCHED = """
import re, sys
from mgpu_env.config.stalltime import StallTimeout
from mgpu_env.training.multiworker.stall import Among, StallWatch, Watched
from mgpu_env.training.multiworker.stallhints import FIRST_STEP, Devices
peer = sys.argv[1]
among = Among("worker 0 (127.0.0.1:1)", "[worker 0] ", {"worker 1": peer}, 60.0)
watch = StallWatch(StallTimeout(2.0), Watched(Devices(2, "CPU", "ring", {}, workers=2), "",
                                              among))
watch.phase(FIRST_STEP)
sys.stderr.write("[worker 0] a line before the stall\\n")
re.match(r"(a+)+$", "a" * 64 + "b")
"""


@pytest.mark.slow
def test_a_worker_stuck_holding_the_gil_is_told_the_setting_that_bounded_its_phase() -> None:
    """The backstop names STALL_TIMEOUT, which set the phase's bound, not WORKER_TIMEOUT;
    its words and the line before them reach stderr though this process never runs Python
    again (stderr's tail is another process)."""
    peer = f"127.0.0.1:{_free_port()}"
    result = subprocess.run([sys.executable, "-c", STUCK_WATCHED, peer], capture_output=True,
                            text=True, timeout=120, env=child_env(Path(tempfile.gettempdir())))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "[worker 0] a line before the stall", result.stderr
    assert lines[1].startswith("[worker 0] error: worker 0 (127.0.0.1:1) made no progress for ")
    assert lines[2].endswith("STALL_TIMEOUT=2s bounded this phase at 2 s (then 5 s of "
                             "grace); WORKER_TIMEOUT caps it for a worker."), result.stderr
    assert len(lines) == 3 and "WORKER_TIMEOUT=" not in result.stderr


def test_a_worker_stuck_while_training_is_told_from_one_that_never_joined() -> None:
    peers = {"chief 0": "h:1", "worker 1": "h:3"}
    found = {"chief 0": "listening", "worker 1": "nothing listens there"}
    assert stuck_message("worker 0 (h:2)", "training", 40.4, 30, 5, peers, found) == (
        "worker 0 (h:2) made no progress for 40 s while training: worker 1 (h:3): nothing "
        "listens there.\n  Fix: start worker 1 with the same cluster settings, or check "
        "that its address can be reached from here. WORKER_TIMEOUT=30 (then 5 s of grace) "
        "sets how long a worker waits."
    )


def test_probe_says_why_an_address_does_not_answer() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert probe(f"127.0.0.1:{listening.getsockname()[1]}") == "listening"
    assert probe(f"127.0.0.1:{_free_port()}").startswith("nothing listens there")
    assert probe("no-such-host.invalid:2222") == (
        "its host name no-such-host.invalid does not resolve")


# ------------------------------------------------------------------------ damaged files


def test_a_truncated_and_a_garbage_npy_are_said_in_words(tmp_path: Path) -> None:
    cut = write_npy(tmp_path / "cut")
    whole = (cut / "x_train.npy").read_bytes()
    (cut / "x_train.npy").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError) as caught:
        load_files(f"npy:{cut}", "npy", cut)
    assert str(caught.value) == (
        f"DATASET=npy:{cut}: {cut / 'x_train.npy'} cannot be read: it is cut short: its "
        f"header says (64, 8, 8) uint8 ({len(whole):,} bytes with the header), but the file "
        f"has {len(whole) // 2:,} bytes.\n"
        "  Fix: copy it again whole, or write it again with np.save (an array of numbers)."
    )
    garbage = write_npy(tmp_path / "garbage")
    (garbage / "y_test.npy").write_bytes(np.random.default_rng(1).bytes(2000))
    with pytest.raises(ConfigError) as caught:
        load_files(f"npy:{garbage}", "npy", garbage)
    assert (f"{garbage / 'y_test.npy'} cannot be read: it is not a .npy file (it does not "
            "start with the .npy header).") in str(caught.value)
    assert "allow_pickle" not in str(caught.value)
    objects = write_npy(tmp_path / "objects")
    np.save(objects / "x_test.npy", np.array([{"a": 1}] * 16, dtype=object))
    with pytest.raises(ConfigError, match="it holds Python objects, not numbers"):
        load_files(f"npy:{objects}", "npy", objects)


@pytest.mark.slow
def test_a_tfrecord_with_a_flipped_byte_is_named_by_its_record(tmp_path: Path) -> None:
    folder = write_tfrecords(tmp_path / "tf", files=2, per_file=32)
    damaged = sorted(folder.glob("*train*"))[1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ConfigError) as caught:
        load_files(f"tfrecord:{folder}", "tfrecord", folder)
    message = str(caught.value)
    first, fix = message.splitlines()
    assert first.startswith(f"DATASET=tfrecord:{folder}: {damaged} cannot be read: record 16 "
                            "is corrupt at byte "), first
    assert first.endswith(" (its checksum does not match its bytes).")
    assert fix == "  Fix: replace the file with a good copy, or remove it."
    for internal in ("{{", "function_node", "[Op:", "ReduceDataset"):
        assert internal not in message
    # Cut short instead: said so.
    cut = write_tfrecords(tmp_path / "cut", files=1, per_file=8)
    short = next(cut.glob("*train*"))
    short.write_bytes(short.read_bytes()[:-7])
    with pytest.raises(ConfigError, match=r"the file is cut short: it ends inside record 7, "
                                          r"which starts at byte [\d,]+\.\n"):
        load_files(f"tfrecord:{cut}", "tfrecord", cut)


# ------------------------------------------------------------------ a folder without kind


def test_a_bare_data_folder_gets_the_kind_it_holds(tmp_path: Path) -> None:
    parse = parse_dataset("auto", "mnist", "digits")
    folder = write_npy(tmp_path / "mynpy")
    with pytest.raises(SettingError, match=rf"did you mean npy:{folder}\?$"):
        parse(str(folder))
    records = write_tfrecords(tmp_path / "records", files=1, per_file=1)
    with pytest.raises(SettingError, match=rf"did you mean tfrecord:{records}\?$"):
        parse(str(records))
    (tmp_path / "pictures" / "train" / "cat").mkdir(parents=True)
    with pytest.raises(SettingError, match=rf"did you mean images:{tmp_path / 'pictures'}\?$"):
        parse(str(tmp_path / "pictures"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SettingError, match="put tfrecord:, images: or npy: before it"):
        parse(str(tmp_path / "empty"))
    # A relative folder, as typed: the suggestion repeats it as given.
    with pytest.raises(SettingsErrors) as caught, contextlib.chdir(tmp_path):
        resolve_settings({}, {"DATASET": "mynpy"})
    assert caught.value.user_message().startswith(
        "error: Bad setting DATASET='mynpy' (from the environment): a folder, without the "
        "kind of its files; did you mean npy:mynpy?\n")
    # A name stays a name, even where a folder of that name exists.
    (tmp_path / "digits").mkdir()
    with contextlib.chdir(tmp_path):
        assert parse("digits") == "digits"


# -------------------------------------------------------------------- read-only folders


@pytest.fixture
def read_only_mount() -> Iterator[Path]:
    """A real read-only filesystem (as root, permission bits stop nothing: only a read-only
    mount, or a volume mounted `:ro`, does)."""
    top = Path(tempfile.mkdtemp())
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(top)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        top.rmdir()
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        yield top
    finally:
        subprocess.run(["umount", str(top)], check=True)
        top.rmdir()


def test_a_read_only_mount_is_named_read_only(read_only_mount: Path) -> None:
    run = read_only_mount / "run"
    access = folder_access(run)
    assert not access.writable
    assert unwritable_folder(access) == (
        f"OUTPUT_DIR={run} cannot be written (it would be created in {read_only_mount}): "
        f"{read_only_mount} is on a read-only filesystem.\n"
        "  Fix: choose an OUTPUT_DIR on a writable one, or mount it read-write (in Docker: "
        "a volume without `:ro`)."
    )


def test_train_refuses_a_read_only_run_folder(read_only_mount: Path) -> None:
    env = child_env(Path(tempfile.gettempdir()), GPUS="none", DATASET="digits",
                    OUTPUT_DIR=str(read_only_mount))
    result = subprocess.run([sys.executable, "-m", "entrypoint", "train"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        f"error: OUTPUT_DIR={read_only_mount} cannot be written: {read_only_mount} is on a "
        "read-only filesystem.\n")
    assert "uid" not in result.stderr and "chown" not in result.stderr


OWN_FOLDER = """
import os, sys
from pathlib import Path
from mgpu_env.hardware.folders import folder_access
from mgpu_env.training.shared.messages import unwritable_folder
os.setgroups([]); os.setgid(65534); os.setuid(65534)
print(unwritable_folder(folder_access(Path(sys.argv[1]))))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to uid 65534 needs root")
def test_a_folder_its_owner_may_not_write_is_not_an_ownership_problem() -> None:
    top = Path(tempfile.mkdtemp())
    try:
        top.chmod(0o755)
        folder = top / "runs"
        folder.mkdir()
        os.chown(folder, 65534, 65534)
        folder.chmod(0o555)
        result = subprocess.run([sys.executable, "-c", OWN_FOLDER, str(folder)],
                                env=child_env(top),
                                capture_output=True, text=True, timeout=60, check=True)
        assert result.stdout == (
            f"OUTPUT_DIR={folder} cannot be written: {folder} is this user's (uid 65534) but "
            "its permissions (mode 0555, or an immutable attribute) forbid writing.\n"
            f"  Fix: `chmod u+w {folder}`, or choose another OUTPUT_DIR.\n"
        )
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=True)


# ------------------------------------------------------------------------------ grammar


def test_counts_take_their_nouns_and_file_kinds_are_named() -> None:
    assert plural(1, "step") == "1 step" and plural(2, "step") == "2 steps"
    assert plural(0, "image") == "0 images"
    described = [DatasetChoice(f"{kind}:/d", "files", Path("/d")).describe()
                 for kind in ("tfrecord", "images", "npy")]
    assert described == ["TFRecord files in /d", "image files in /d", ".npy files in /d"]


# ------------------------------------------------------------------- a requested stop


def test_a_requested_stop_is_not_an_error() -> None:
    stopped = Interrupted("SIGTERM received: training stopped during epoch 2 of 5", 15)
    assert stopped.user_message() == "SIGTERM received: training stopped during epoch 2 of 5"
    assert stopped.exit_code == 143


@pytest.mark.slow
def test_sigterm_stops_training_without_an_error_line(tmp_path: Path) -> None:
    output = tmp_path / "run"
    env = child_env(tmp_path / "home", GPUS="none", DATASET="digits", EPOCHS="200", QUIET="1",
                    OUTPUT_DIR=str(output))
    process = subprocess.Popen([sys.executable, "-m", "entrypoint", "train"], env=env,
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 240
        while completed_epochs(output) < 1 and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert stderr.startswith("SIGTERM received: training stopped during epoch "), stderr
    assert "error" not in stderr and "Traceback" not in stderr
    assert f"Resume with: OUTPUT_DIR={output} mgpu train" in stderr
