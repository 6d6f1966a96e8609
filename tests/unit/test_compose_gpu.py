"""The container uses the GPUs where there are GPUs: `make docker-*` pick the GPU compose
file (docker/compose-files.sh), a container started with the CPU file on a GPU host stops
in the doctor and the pre-flight, and the path without registry access agrees with itself
(`make build-cpu`'s tag, MGPU_IMAGE, the compose files)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
import yaml

from mgpu_env.config.errors import RunFailed
from mgpu_env.doctor import checks, require_ready
from mgpu_env.hardware import hostgpus
from mgpu_env.hardware.nvml import Probed
from tests.support.children import REPO
from tests.support.fake_doctor import healthy_host, make_facts
from tests.support.fake_nvml import FakeNvml
from tests.support.runtimes import runtime_for

Install = Callable[[FakeNvml], FakeNvml]
NO_DRIVER = FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


# ----------------------------------------------------------------- the host's GPUs


def test_the_host_gpus_are_counted_from_the_drivers_proc_entries(tmp_path: Path) -> None:
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (tmp_path / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
    assert hostgpus.host_nvidia_gpus(tmp_path) == 2


def test_without_the_driver_the_pci_devices_count(tmp_path: Path) -> None:
    devices = {"0000:17:00.0": ("0x10de", "0x030200"),  # a data-centre GPU: 3D controller
               "0000:18:00.0": ("0x10de", "0x040300"),  # its audio function: not a GPU
               "0000:00:02.0": ("0x8086", "0x030000")}  # another vendor's display
    for name, (vendor, kind) in devices.items():
        folder = tmp_path / "sys/bus/pci/devices" / name
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(kind + "\n")
    assert hostgpus.host_nvidia_gpus(tmp_path) == 1
    assert hostgpus.host_nvidia_gpus(tmp_path / "nothing") == 0


@pytest.mark.parametrize(
    ("environ", "gpus_here", "host_gpus", "says"),
    [({"MGPU_COMPOSE": "cpu"}, 0, 2, True),
     ({"MGPU_COMPOSE": "cpu"}, 0, 0, False),  # a CPU machine: nothing to say
     ({"MGPU_COMPOSE": "gpu"}, 0, 2, False),  # the GPU file: the doctor's driver line
     ({}, 0, 2, False),  # not started by compose
     ({"MGPU_COMPOSE": "cpu"}, 2, 2, False)],  # GPUs given some other way
)
def test_the_cpu_file_on_a_gpu_host_is_named(
    environ: dict[str, str], gpus_here: int, host_gpus: int, says: bool
) -> None:
    message = hostgpus.gpus_left_outside(environ, gpus_here, host_gpus)
    assert (message is not None) == says
    if message:
        assert "host has 2 NVIDIA GPU(s)" in message and "make docker-train" in message
        assert hostgpus.GPU_COMPOSE_FILES in message


def test_the_doctor_stops_on_the_cpu_file_on_a_gpu_host(use_fake_nvml: Install) -> None:
    use_fake_nvml(NO_DRIVER)
    host = healthy_host(device_files=Probed(value=()), host_gpus=Probed(value=4))
    facts = make_facts("all", environ={"MGPU_COMPOSE": "cpu"}, host=host)
    (nvml,) = [c for c in checks.run_checks(facts, checks.ALL_CHECKS) if c.id == "driver.nvml"]
    assert nvml.status == "error"
    assert "host has 4 NVIDIA GPU(s)" in nvml.found and "CPU compose file" in nvml.found
    assert "COMPOSE_FILE=docker-compose.yml:docker-compose.gpu.yml" in nvml.fix
    # GPUS=none is how to mean the CPU: then it is no error.
    facts = make_facts("none", environ={"MGPU_COMPOSE": "cpu"}, host=host)
    (nvml,) = [c for c in checks.run_checks(facts, checks.ALL_CHECKS) if c.id == "driver.nvml"]
    assert nvml.status != "error"


def test_training_does_not_start_on_the_cpu_of_a_gpu_host(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(NO_DRIVER)
    monkeypatch.setenv("MGPU_COMPOSE", "cpu")
    monkeypatch.setattr(hostgpus, "host_nvidia_gpus", lambda: 2)
    with pytest.raises(RunFailed, match="host has 2 NVIDIA GPU"):
        require_ready(runtime_for("all", {}))
    require_ready(runtime_for("none", {}))  # the CPU, on purpose
    monkeypatch.setattr(hostgpus, "host_nvidia_gpus", lambda: 0)
    require_ready(runtime_for("all", {}))  # a machine without GPUs


# ------------------------------------------------------- make docker-*: which files


def fake_tools(folder: Path, gpus: int, runtimes: str) -> dict[str, str]:
    """A PATH with `nvidia-smi` listing `gpus` GPUs (none: absent) and a `docker` whose
    `docker info` lists `runtimes`; the rest of PATH is the system's."""
    folder.mkdir()
    if gpus:
        listing = "".join(f"GPU {i}: NVIDIA H100 (UUID: GPU-{i})\\n" for i in range(gpus))
        (folder / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    (folder / "docker").write_text(f"#!/bin/sh\necho '{runtimes}'\n")
    for tool in folder.iterdir():
        tool.chmod(0o755)
    system = ":".join(p for p in os.environ["PATH"].split(":")
                      if not (Path(p) / "nvidia-smi").exists()
                      and not (Path(p) / "nvidia-container-runtime-hook").exists())
    env = {k: v for k, v in os.environ.items() if k not in ("COMPOSE_FILE", "DOCKER_GPUS")}
    return {**env, "PATH": f"{folder}:{system}"}


NVIDIA_RUNTIME = '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}'
RUNC_ONLY = '{"runc":{"path":"runc"}}'


@pytest.mark.parametrize(
    ("gpus", "runtimes", "extra", "files", "why"),
    [(2, NVIDIA_RUNTIME, {}, "docker-compose.yml:docker-compose.gpu.yml",
      "2 NVIDIA GPU(s) and Docker's NVIDIA runtime"),
     (0, NVIDIA_RUNTIME, {}, "docker-compose.yml", "no NVIDIA GPU on this host"),
     (2, RUNC_ONLY, {"DOCKER_GPUS": "0"}, "docker-compose.yml", "DOCKER_GPUS=0"),
     (0, RUNC_ONLY, {"DOCKER_GPUS": "1"}, "docker-compose.yml:docker-compose.gpu.yml",
      "DOCKER_GPUS=1"),
     (2, NVIDIA_RUNTIME, {"COMPOSE_FILE": "mine.yml"}, "mine.yml", "as set")],
)
def test_make_picks_the_compose_files(
    tmp_path: Path, gpus: int, runtimes: str, extra: dict[str, str], files: str, why: str
) -> None:
    env = {**fake_tools(tmp_path / "bin", gpus, runtimes), **extra}
    result = subprocess.run([REPO / "docker/compose-files.sh"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == files
    assert why in result.stderr


def test_gpus_docker_cannot_reach_stop_make_with_the_fix(tmp_path: Path) -> None:
    env = fake_tools(tmp_path / "bin", 2, RUNC_ONLY)
    result = subprocess.run([REPO / "docker/compose-files.sh"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 1 and result.stdout == ""
    assert "this host has 2 NVIDIA GPU(s), but Docker cannot give them" in result.stderr
    assert "nvidia-ctk runtime configure" in result.stderr and "DOCKER_GPUS=0" in result.stderr


def test_the_docker_targets_run_compose_with_the_picked_files(tmp_path: Path) -> None:
    # `make -n` prints the recipe: the picked files reach compose as COMPOSE_FILE.
    result = subprocess.run(["make", "-n", "docker-train", "COMPOSE=docker-compose"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert 'files="$(DOCKER_GPUS=auto docker/compose-files.sh)"' in result.stdout
    assert 'COMPOSE_FILE="$files"' in result.stdout
    assert "docker-compose run --rm train" in result.stdout


# ------------------------------------------------------- the path without a registry


def compose_services(name: str) -> dict[str, dict[str, object]]:
    document = yaml.safe_load((REPO / name).read_text())
    return document["services"]


def test_the_compose_files_mark_which_file_started_the_container() -> None:
    cpu = compose_services("docker-compose.yml")["train"]
    assert "MGPU_COMPOSE=cpu" in cpu["environment"]  # type: ignore[operator]
    gpu = yaml.safe_load((REPO / "docker-compose.gpu.yml").read_text())["x-gpu"]
    assert "MGPU_COMPOSE=gpu" in gpu["environment"]


def test_build_cpu_the_compose_files_and_the_docs_name_one_image() -> None:
    makefile = (REPO / "Makefile").read_text()
    (cpu_image,) = re.findall(r"^CPU_IMAGE \?= (\S+)$", makefile, re.M)
    assert "IMAGE=$(CPU_IMAGE)" in makefile
    for name in ("docker-compose.yml", "docker-compose.multiworker.yml"):
        for service in compose_services(name).values():
            assert service["image"] == "${MGPU_IMAGE:-mgpu-env:latest}", name
    assert f"MGPU_IMAGE={cpu_image}" in (REPO / ".env.example").read_text()
    assert f'TEST_IMAGE="${{TEST_IMAGE:-{cpu_image}}}"' in (
        REPO / "docker/test-container.sh").read_text()
    assert f"MGPU_IMAGE={cpu_image} make docker-train" in (REPO / "docs/container.md").read_text()
    assert f"make build-cpu && MGPU_IMAGE={cpu_image} make docker-train" in (
        REPO / "README.md").read_text()
