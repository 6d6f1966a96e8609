"""A run folder this user cannot write is caught before TensorFlow starts, by `mgpu train`
(exit 2) and by `mgpu doctor`, with the owner's uid, this process's and the fix.

Tests run as root here, where permission bits stop no write; the real check therefore runs
in a child that drops to `nobody` (uid 65534) after its imports, so the kernel answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.parsers import parse_gpus
from mgpu_env.doctor.checks import check_run_folder
from mgpu_env.doctor.facts import Facts, HostFacts
from mgpu_env.hardware.folders import FolderAccess, folder_access
from mgpu_env.hardware.nvml import GpuListing, NvmlSnapshot
from tests.support.children import child_env
from tests.support.runtimes import runtime_of

NOBODY = 65534
AS_NOBODY = """
import os, sys
from pathlib import Path
from mgpu_env.hardware.folders import folder_access
os.setgroups([]); os.setgid({uid}); os.setuid({uid})
access = folder_access(Path(sys.argv[1]))
print(access.writable, access.owner_uid, access.process_uid, access.decides)
print(access.problem())
"""


@pytest.fixture
def read_only_folder() -> Iterator[Path]:
    # Outside pytest's 0700 tmp folders, so `nobody` can reach it.
    top = Path(tempfile.mkdtemp())
    top.chmod(0o755)
    folder = top / "runs"
    folder.mkdir(mode=0o555)
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)
    subprocess.run(["rm", "-rf", str(top)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to uid 65534 needs root")
def test_a_read_only_folder_is_unwritable_for_another_user(read_only_folder: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", AS_NOBODY.format(uid=NOBODY), str(read_only_folder / "run")],
        capture_output=True, text=True, env=child_env(read_only_folder.parent),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == f"False 0 {NOBODY} {read_only_folder}"
    assert second == (f"OUTPUT_DIR={read_only_folder / 'run'} cannot be written (it would be "
                      f"created in {read_only_folder}): {read_only_folder} belongs to uid 0 "
                      f"and this process runs as uid {NOBODY}")


def test_a_writable_folder_is_fine(tmp_path: Path) -> None:
    access = folder_access(tmp_path / "new" / "run")
    assert access.writable and access.decides == tmp_path and access.problem() is None


UNWRITABLE = FolderAccess(Path("/data/runs/x"), Path("/data/runs"), False, 1000, 0)


def test_training_stops_before_the_preflight_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from entrypoint.app import app
    from mgpu_env import doctor
    from mgpu_env.training.run import plan

    def no_preflight(runtime: object, **kwargs: object) -> None:
        raise AssertionError("the folder is checked first")

    monkeypatch.setattr(plan, "folder_access", lambda path: UNWRITABLE)
    monkeypatch.setattr(doctor, "require_ready", no_preflight)
    result = CliRunner().invoke(app, ["train", "--dry-run"],
                                env={"GPUS": "none", "OUTPUT_DIR": "/data/runs/x"})
    assert result.exit_code == 2, result.output
    assert "belongs to uid 1000 and this process runs as uid 0" in result.stderr
    assert "HOST_UID=$(id -u) HOST_GID=$(id -g)" in result.stderr
    assert "make docker-train" in result.stderr
    with pytest.raises(ConfigError) as caught:  # the plan checks it too (library callers)
        plan.plan_training(runtime_of({"GPUS": "none", "OUTPUT_DIR": "/data/runs/x"}))
    assert caught.value.exit_code == 2


def doctor_facts(run_folder: FolderAccess | None) -> Facts:
    return Facts(request=parse_gpus("all"), nvml=NvmlSnapshot(GpuListing(())), selection=None,
                 selection_error=None, environ={}, host=HostFacts(), versions={},
                 run_folder=run_folder)


def test_the_doctor_reports_it_as_an_error_with_the_fix() -> None:
    check = check_run_folder(doctor_facts(UNWRITABLE))
    assert check.status == "error" and "uid 1000" in check.found
    assert "make docker-train" in (check.fix or "")
    assert check_run_folder(doctor_facts(None)).status == "skip"


AS_NOBODY_TRAIN = """
import os, sys
from mgpu_env.config.errors import ConfigError
from mgpu_env.training.run.plan import check_output_dir
from tests.support.runtimes import runtime_of
runtime = runtime_of({{"GPUS": "none", "OUTPUT_DIR": sys.argv[1]}})
os.setgroups([]); os.setgid({uid}); os.setuid({uid})
try:
    check_output_dir(runtime)
    print("writable")
except ConfigError as err:
    print(str(err).splitlines()[0])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to uid 65534 needs root")
@pytest.mark.parametrize("inside", ["checkpoints", "logs"])
def test_a_folder_inside_the_run_folder_that_cannot_be_written_is_caught_first(
    read_only_folder: Path, inside: str,
) -> None:
    # The run folder is nobody's; a folder the run writes inside it (as a resume finds it)
    # is root's: found before TensorFlow starts, not at the first save.
    run = read_only_folder.parent / "run"
    (run / inside).mkdir(parents=True)
    os.chown(run, NOBODY, NOBODY)
    result = subprocess.run(
        [sys.executable, "-c", AS_NOBODY_TRAIN.format(uid=NOBODY), str(run)],
        capture_output=True, text=True, env=child_env(read_only_folder.parent), timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"OUTPUT_DIR={run / inside} cannot be written: {run / inside} belongs to uid 0 and "
        f"this process runs as uid {NOBODY}."), result.stdout
    os.chown(run / inside, NOBODY, NOBODY)
    again = subprocess.run(
        [sys.executable, "-c", AS_NOBODY_TRAIN.format(uid=NOBODY), str(run)],
        capture_output=True, text=True, env=child_env(read_only_folder.parent), timeout=60,
    )
    assert again.stdout.strip() == "writable", again.stdout + again.stderr
