"""A run folder's files read as untrusted input (`training.run.state`), fuzzed.

Two real runs of `mgpu train` make the folders (this run's, and another run's whose files
are copied in); then every file a resume reads is damaged in every way, and the resume's
plan, the pure part of a start that reads the folder, must either resume from this run's
latest checkpoint or refuse (exit 2) naming the file, with a way out that works: the
`--resume-from` it names is applied and the plan then resumes from that checkpoint. No
TensorFlow in the fuzzing itself; one case goes end to end through `mgpu train`.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.run.identity import identify
from mgpu_env.training.run.plan import plan_training
from mgpu_env.training.run.repair import resume_from_checkpoint
from mgpu_env.training.run.resume import resolve_run_settings
from mgpu_env.training.run.state import Checkpoint, DamagedRunFolder
from mgpu_env.training.shared.position import Position
from tests.support.runtimes import runtime_of
from tests.support.train_process import metrics, run

pytestmark = pytest.mark.slow  # the two runs that make the folders train for real

SETTINGS = {"EPOCHS": "1", "CHECKPOINT_EVERY": "10"}
# Digits, a global batch of 64: 22 steps an epoch; kept: ckpt-0-10, ckpt-0-20, ckpt-1.
LATEST = "ckpt-1"
FILES = ("run.json", "settings.json", "history.json", "metrics.json",
         "checkpoints/checkpoint", f"checkpoints/{LATEST}.index",
         f"checkpoints/{LATEST}.data-00000-of-00001", "checkpoints/ckpt-0-10.index",
         "checkpoints/ckpt-0-20.data-00000-of-00001")
DAMAGES = ("truncate", "zero-length", "zero-bytes", "garbage", "not-utf8", "delete",
           "another-run")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    top = tmp_path_factory.mktemp("folders")
    ours, other = top / "ours", top / "other"
    assert run(ours, **SETTINGS).returncode == 0
    # Another run: another seed, trained further (its index names ckpt-2).
    assert run(other, EPOCHS="2", CHECKPOINT_EVERY="10", SEED="7").returncode == 0
    return ours, other


def damage(path: Path, how: str, other: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "zero-length":
        path.write_bytes(b"")
    elif how == "zero-bytes":
        path.write_bytes(bytes(len(data)))
    elif how == "garbage":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(len(data))))
    elif how == "not-utf8":
        path.write_bytes(data[:7] + b"\xff\xfe\xc3" + data[10:])
    elif how == "delete":
        path.unlink()
    else:  # the other run's file of that name, or of that kind where it kept no such one
        kind = other.name.split(".", 1)[-1]
        found = other if other.exists() else sorted(other.parent.glob(f"ckpt-*.{kind}"))[-1]
        shutil.copyfile(found, path)


def plan_of(folder: Path, epochs: str = "2") -> tuple[int, int]:
    """The pure start of `OUTPUT_DIR=folder EPOCHS=2 mgpu train`: where it resumes."""
    env = {"GPUS": "none", "DATASET": "digits", "OUTPUT_DIR": str(folder), "EPOCHS": epochs,
           "CHECKPOINT_EVERY": "10"}
    plan = plan_training(runtime_of(resolve_run_settings({}, env)))
    return plan.resume.epoch, plan.resume.step


def test_every_file_damaged_every_way_is_a_named_refusal_or_a_correct_resume(
    folders: tuple[Path, Path], tmp_path: Path,
) -> None:
    ours, other = folders
    assert plan_of(ours) == (1, 0)
    rng = random.Random(42)
    outcomes: Counter[str] = Counter()
    table: dict[tuple[str, str], str] = {}
    for file in FILES:
        for how in DAMAGES:
            case = tmp_path / f"{file.replace('/', '_')}-{how}"
            shutil.copytree(ours, case)
            damage(case / file, how, other / file, rng)
            try:
                position = plan_of(case)
            except DamagedRunFolder as refused:
                outcomes["refused"] += 1
                table[file, how] = f"refused: {str(refused).splitlines()[0]}"
                check_refusal(case, file, how, refused)
                continue
            except ConfigError as refused:
                raise AssertionError(
                    f"{file} {how}: refused without the way out: {refused}") from None
            # A resume: only from this run's latest, whose files are all still good.
            assert position == (1, 0), (file, how, position)
            outcomes["resumed"] += 1
            table[file, how] = "resumed"
    print(*(f"{f} {h}: {o}" for (f, h), o in table.items()), outcomes, sep="\n")
    assert sum(outcomes.values()) == len(FILES) * len(DAMAGES) == 63
    assert outcomes["refused"] >= 40, outcomes  # every damage to what the resume reads


def check_refusal(case: Path, file: str, how: str, refused: DamagedRunFolder) -> None:
    message = str(refused)
    assert refused.exit_code == 2
    named = Path(file).name
    assert named in message or (named == f"{LATEST}.data-00000-of-00001"
                                and LATEST in message), (file, how, message)
    good: Checkpoint | None = refused.good
    if good is None:
        assert "No complete checkpoint is left" in message
        return
    command = f"OUTPUT_DIR={case} mgpu train --resume-from {good.name}"
    assert command in message, message
    # The way out works: the folder resumes from the checkpoint it named.
    env = {"GPUS": "none", "DATASET": "digits", "OUTPUT_DIR": str(case), "EPOCHS": "2"}
    start = identify(runtime_of(resolve_run_settings({}, env)))
    resume_from_checkpoint(case, good.name, start.values)
    position = Position.parse(good.name)
    assert position is not None
    assert plan_of(case) == (position.epoch, position.step), (file, how)


def test_a_damaged_index_is_refused_by_mgpu_train_and_the_command_it_names_resumes(
    folders: tuple[Path, Path], tmp_path: Path,
) -> None:
    ours, _ = folders
    case = tmp_path / "run"
    shutil.copytree(ours, case)
    (case / "checkpoints" / "checkpoint").write_bytes(random.Random(1).randbytes(300))
    refused = run(case, EPOCHS="2", CHECKPOINT_EVERY="10")
    assert refused.returncode == 2, refused.stderr
    assert "checkpoints/checkpoint is not text" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert f"--resume-from {LATEST}" in refused.stderr
    assert sorted(p.name for p in (case / "checkpoints").iterdir()) == sorted(
        p.name for p in (ours / "checkpoints").iterdir())  # nothing replaced
    resumed = run(case, "--resume-from", LATEST, EPOCHS="2", CHECKPOINT_EVERY="10")
    assert resumed.returncode == 0, resumed.stderr
    assert "set aside in" in resumed.stdout
    found = metrics(case)
    assert (found["resumed_from_epoch"], found["resumed_from_step"]) == (1, 0)
    assert [e["epoch"] for e in found["history"]] == [1, 2]
    aside = list((case / "set-aside").glob("*/checkpoints/checkpoint"))
    assert len(aside) == 1  # the damaged index kept, not deleted
    # The same command again (a launcher's restart, a requeued job's script) sets nothing
    # aside that was trained since: the folder resumes from its latest, ckpt-2.
    env = {"GPUS": "none", "DATASET": "digits", "OUTPUT_DIR": str(case), "EPOCHS": "3"}
    start = identify(runtime_of(resolve_run_settings({}, env)))
    (note,) = resume_from_checkpoint(case, LATEST, start.values)
    assert note.startswith(f"--resume-from {LATEST}: done before (") and "as it is" in note
    assert plan_of(case, epochs="3") == (2, 0)


def test_epochs_below_what_the_folder_holds_is_refused_like_a_finished_run(
    folders: tuple[Path, Path], tmp_path: Path,
) -> None:
    _, other = folders
    case = tmp_path / "run"
    shutil.copytree(other, case)
    # The other run keeps ckpt-1-8, ckpt-1-18 and ckpt-2: stop it at step 18 of epoch 2.
    env = {"GPUS": "none", "DATASET": "digits", "OUTPUT_DIR": str(case), "SEED": "7"}
    start = identify(runtime_of(resolve_run_settings({}, env)))
    resume_from_checkpoint(case, "ckpt-1-18", start.values)
    assert plan_of(case, epochs="2") == (1, 18)
    with pytest.raises(ConfigError) as caught:
        plan_of(case, epochs="1")
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith(
        f"OUTPUT_DIR={case} holds this run trained to step 18 of epoch 2 (1 epoch and 18 "
        "steps), beyond EPOCHS=1")
    assert "EPOCHS=2 or more with the same OUTPUT_DIR" in str(caught.value)


def test_a_checkpoint_tensorflow_cannot_restore_is_refused_naming_the_one_before(
    folders: tuple[Path, Path], tmp_path: Path,
) -> None:
    from mgpu_env.training.run.bundle import read_index

    ours, _ = folders
    case = tmp_path / "run"
    shutil.copytree(ours, case)
    # The object graph is a string tensor, whose bytes only TensorFlow's restore checks.
    prefix = case / "checkpoints" / LATEST
    _, entries = read_index(prefix)
    graph = next(e for e in entries if e.name == "_CHECKPOINTABLE_OBJECT_GRAPH")
    data = Path(f"{prefix}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[graph.offset + 8:graph.offset + graph.size] = bytes(graph.size - 8)
    data.write_bytes(bytes(raw))
    refused = run(case, EPOCHS="2", CHECKPOINT_EVERY="10")
    assert refused.returncode == 2, refused.stderr
    assert f"checkpoints/{LATEST} cannot be restored (" in refused.stderr
    assert "--resume-from ckpt-0-20" in refused.stderr and "Traceback" not in refused.stderr
