"""GPUS against a fake NVML with 0, 1, 2 and 8 GPUs; CUDA_VISIBLE_DEVICES set before TF."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.settings import SettingError, parse_gpus
from mgpu_env.hardware import nvml
from mgpu_env.hardware.devices import HIDE_ALL_GPUS, cuda_environment, select_gpus
from tests.support.children import REPO
from tests.support.fake_nvml import FakeNvml, fake_with


def selection_for(count: int, text: str, environ: dict[str, str] | None = None):
    fake = fake_with(count)
    listing_fake = fake

    def load() -> FakeNvml:
        return listing_fake

    original = nvml.load_library
    nvml.load_library = load
    try:
        listing = nvml.snapshot().listing
    finally:
        nvml.load_library = original
    return select_gpus(parse_gpus(text), listing, {} if environ is None else environ), fake


@pytest.mark.parametrize("count", [1, 2, 8])
def test_all_selects_every_gpu_in_nvidia_smi_order(count: int) -> None:
    selection, _ = selection_for(count, "all")
    assert [g.index for g in selection.gpus] == list(range(count))
    assert selection.cuda_visible_devices == ",".join(str(i) for i in range(count))


def test_all_with_no_gpu_falls_back_to_cpu_with_a_note() -> None:
    selection, _ = selection_for(0, "all")
    assert selection.uses_cpu and selection.cuda_visible_devices is None
    assert selection.note and "CPU" in selection.note


def test_all_keeps_a_preset_cuda_visible_devices() -> None:
    selection, _ = selection_for(2, "all", {"CUDA_VISIBLE_DEVICES": "1"})
    assert selection.cuda_visible_devices is None
    assert "already set" in (selection.note or "")
    # Only the GPUs the preset leaves visible are judged (precision, memory, pre-flight).
    assert [g.index for g in selection.gpus] == [1]


def test_a_preset_by_uuid_and_one_that_hides_everything() -> None:
    fake = fake_with(4)
    uuid = fake.gpus[3].uuid
    selection, _ = selection_for(4, "all", {"CUDA_VISIBLE_DEVICES": f"2,{uuid[:14]}"})
    assert [g.index for g in selection.gpus] == [2, 3]
    selection, _ = selection_for(4, "all", {"CUDA_VISIBLE_DEVICES": "-1"})
    assert selection.gpus == ()
    # CUDA stops at the first id that matches nothing.
    selection, _ = selection_for(4, "all", {"CUDA_VISIBLE_DEVICES": "1,9,2"})
    assert [g.index for g in selection.gpus] == [1]


@pytest.mark.parametrize("count", [0, 1, 2, 8])
def test_none_hides_every_gpu(count: int) -> None:
    selection, _ = selection_for(count, "none")
    assert selection.uses_cpu and selection.cuda_visible_devices == HIDE_ALL_GPUS


@pytest.mark.parametrize(
    ("count", "text", "visible"),
    [(1, "0", "0"), (2, "0,1", "0,1"), (2, "1", "1"), (8, "7,3", "7,3"), (8, " 2 , 5 ", "2,5")],
)
def test_indices_within_range(count: int, text: str, visible: str) -> None:
    selection, _ = selection_for(count, text)
    assert selection.cuda_visible_devices == visible
    assert [g.index for g in selection.gpus] == [int(i) for i in visible.split(",")]


@pytest.mark.parametrize(("count", "text"), [(0, "0"), (1, "1"), (2, "0,2"), (8, "8")])
def test_out_of_range_index_is_refused(count: int, text: str) -> None:
    with pytest.raises(SettingError, match="there is no GPU"):
        selection_for(count, text)


def test_uuids_full_and_unique_prefix() -> None:
    fake = fake_with(2)
    uuids = [g.uuid for g in fake.gpus]
    selection, _ = selection_for(2, uuids[1])
    assert selection.cuda_visible_devices == uuids[1]
    assert [g.index for g in selection.gpus] == [1]
    prefix = uuids[0][:12]
    selection, _ = selection_for(2, prefix)
    assert [g.index for g in selection.gpus] == [0]


def test_unknown_uuid_is_refused_listing_known_ones() -> None:
    with pytest.raises(SettingError, match="matches no GPU; NVML's UUIDs: GPU-"):
        selection_for(2, "GPU-deadbeef-0000")


def test_apply_sets_pci_bus_order_and_visible_devices() -> None:
    selection, _ = selection_for(2, "0,1")
    environ = cuda_environment(selection.cuda_visible_devices)
    assert environ == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_cli_refuses_missing_gpu_with_exit_2(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml],
) -> None:
    use_fake_nvml(fake_with(2))
    result = CliRunner().invoke(app, ["train", "--gpus", "0,2", "--dry-run"])
    assert result.exit_code == 2
    assert "GPUS='0,2'" in result.stderr and "there is no GPU 2" in result.stderr
    assert "indices 0..1" in result.stderr


def test_cli_refuses_gpu_index_without_driver(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml],
) -> None:
    import pynvml

    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={"GPUS": "0"})
    assert result.exit_code == 2
    assert "NVML could not start" in result.stderr and "Traceback" not in result.output


# Runs the real CLI in a fresh interpreter with two fake GPUs, and records the environment
# and whether TensorFlow was already imported at the moment the selection was applied.
_PROBE = """
import json, os, sys
sys.path.insert(0, {repo!r})
from tests.support.fake_nvml import fake_with
import mgpu_env.hardware.nvml as nvml
nvml.load_library = lambda: fake_with(2)
import mgpu_env.runtime.execution as launch
seen = {{}}
original = launch.apply_environment
def spy(environment, environ):
    original(environment, environ)
    seen.update(tf_imported="tensorflow" in sys.modules,
                visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                order=os.environ.get("CUDA_DEVICE_ORDER"))
    print("SEEN " + json.dumps(seen), flush=True)
    os._exit(0)
launch.apply_environment = spy
from entrypoint.app import main
sys.argv = ["mgpu", "train"]
main()
"""


def test_gpus_0_1_sets_cuda_env_before_tensorflow_is_imported() -> None:
    env = {"GPUS": "0,1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(repo=str(REPO))],
        capture_output=True, text=True, env=env, timeout=120,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("SEEN "))
    seen = json.loads(line[5:])
    assert seen == {"tf_imported": False, "visible": "0,1", "order": "PCI_BUS_ID"}


def test_gpus_none_is_said_to_be_the_cpu_on_purpose(tmp_path: Path) -> None:
    """GPUS=none trains on the CPU on purpose, and the start summary says so."""
    env = {"OUTPUT_DIR": str(tmp_path / "run")}
    chosen = CliRunner().invoke(app, ["train", "--dry-run", "--gpus", "none"], env=env)
    assert chosen.exit_code == 0, chosen.output
    assert "1 x CPU (CPU; GPUS=none: the CPU on purpose, every GPU hidden)" in chosen.stdout
