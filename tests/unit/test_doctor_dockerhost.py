"""Docker's host side, walked: each combination of the daemon (rootful or rootless, cgroupfs or
systemd, cgroup v1 or v2, its version and runtimes), the NVIDIA Container Toolkit's config.toml
(mode, no-cgroups, ldconfig), daemon.json, libnvidia-container's version and the CDI specs.
The machine is files under MGPU_HOST_ROOT and `docker` is a script on PATH that answers
`docker info --format '{{json .}}'` with a real daemon's JSON; the probe
(`hardware.dockerhost.collect`) runs as it runs on a host, nothing of the doctor replaced.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.doctor.checks import Check
from mgpu_env.doctor.checks.dockerhost import (
    FIX_CONTAINER_TOOLKIT,
    FIX_REGENERATE_CDI,
    FIX_ROOTLESS,
    FIX_SNAP_DOCKER,
    FIX_SYSTEMD_RELOAD,
    check_docker,
)
from mgpu_env.hardware import dockerhost
from tests.support.fake_doctor import healthy_host, make_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakelimits import host_root

Install = Callable[[FakeNvml], FakeNvml]
DRIVER = "550.54.14"
# `docker info --format '{{json .}}'` of a rootful Docker 27 with the NVIDIA runtime (trimmed
# to the keys a daemon always writes around the ones read).
INFO: dict[str, Any] = {
    "ID": "7c1b3e8f-5a2d-4c6e-9f10-2b3c4d5e6f70", "Containers": 3, "Driver": "overlay2",
    "CgroupDriver": "cgroupfs", "CgroupVersion": "2", "KernelVersion": "6.8.0-45-generic",
    "OperatingSystem": "Ubuntu 24.04.1 LTS", "ServerVersion": "27.3.1",
    "Runtimes": {"io.containerd.runc.v2": {"path": "runc"},
                 "nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}},
    "DefaultRuntime": "runc", "DockerRootDir": "/var/lib/docker",
    "SecurityOptions": ["name=apparmor", "name=seccomp,profile=builtin", "name=cgroupns"],
    "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"], "Warnings": None,
}
TOOLKIT = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true
#no-cgroups = false

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]
"""


def cdi_spec(gpus: int, driver: str = DRIVER) -> str:
    """A CDI spec as `nvidia-ctk cdi generate` writes it (trimmed)."""
    devices = "".join(
        f'- containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}\n  name: "{i}"\n'
        for i in range(gpus))
    return (f"---\ncdiVersion: 0.5.0\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n"
            f"  hooks:\n  - args:\n    - nvidia-cdi-hook\n    - update-ldcache\n    hookName: "
            f"createContainer\n    path: /usr/bin/nvidia-cdi-hook\n  mounts:\n  - containerPath: "
            f"/usr/lib/x86_64-linux-gnu/libcuda.so.{driver}\n    hostPath: /usr/lib/"
            f"x86_64-linux-gnu/libcuda.so.{driver}\n    options:\n    - ro\ndevices:\n{devices}"
            f'- containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n  name: all\n'
            f"kind: nvidia.com/gpu\n")


def machine(root: Path, *, gpus: int = 4, toolkit: str | None = TOOLKIT,
            daemon_json: dict[str, Any] | None = None, cdi: str | None = None,
            libnvidia_container: str = "1.17.3", dev_char: bool = False) -> None:
    """A GPU host as files: /dev/nvidia*, the driver, the toolkit's files, Docker's config."""
    def write(path: str, text: str) -> None:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    for i in range(gpus):
        write(f"/dev/nvidia{i}", "")
    write("/dev/nvidiactl", "")
    write("/sys/module/nvidia/version", DRIVER + "\n")
    write(f"/usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}", "")
    write(f"/usr/lib/x86_64-linux-gnu/libnvidia-container.so.{libnvidia_container}", "")
    write("/sbin/ldconfig.real", "")
    if toolkit is not None:
        write(dockerhost.TOOLKIT_CONFIG, toolkit)
    write(dockerhost.DAEMON_JSON, json.dumps(daemon_json if daemon_json is not None else {
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}))
    if cdi is not None:
        write("/etc/cdi/nvidia.yaml", cdi)
    if dev_char:
        (root / "dev/char").mkdir(parents=True)
        for i in range(gpus):
            (root / f"dev/char/195:{i}").symlink_to(f"../nvidia{i}")


def docker_command(folder: Path, info: dict[str, Any] | None, error: str = "") -> str:
    """A `docker` on PATH that answers `docker info` as a daemon does (or fails as it does)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "docker"
    answer = (f"cat <<'EOF'\n{json.dumps(info)}\nEOF\n" if info is not None else
              f"echo '{error}' >&2\nexit 1\n")
    script.write_text(f'#!/bin/sh\n[ "$1" = info ] || exit 2\n{answer}')
    script.chmod(0o755)
    return str(folder)


def judged(tmp_path: Path, info: dict[str, Any] | None = None, error: str = "",
           **machine_facts: Any) -> dict[str, list[Check]]:
    root = tmp_path / "host"
    machine(root, **machine_facts)
    path = docker_command(tmp_path / "bin", info, error)
    with host_root(root):
        found = dockerhost.collect(path)
    facts = make_facts("all", host=healthy_host())
    checks: dict[str, list[Check]] = {}
    for c in check_docker(dataclasses.replace(facts, docker=found)):
        checks.setdefault(c.id, []).append(c)
    return checks


def statuses(checks: dict[str, list[Check]]) -> dict[str, list[str]]:
    return {k: [c.status for c in v] for k, v in checks.items()}


def info(**changes: Any) -> dict[str, Any]:
    return {**INFO, **changes}


ROOTLESS = ["name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"]
RUNC_ONLY = {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}
NO_CGROUPS = TOOLKIT.replace("#no-cgroups = false", "no-cgroups = true")


@pytest.mark.parametrize(("name", "answer", "facts", "expected", "fix"), [
    ("rootful, cgroupfs, the runtime", info(), {},
     {"host.docker": ["ok"], "host.toolkit": ["ok"]}, ""),
    ("rootful, systemd, CDI only", info(CgroupDriver="systemd", Runtimes=RUNC_ONLY),
     {"cdi": cdi_spec(4), "toolkit": TOOLKIT.replace('"auto"', '"cdi"'), "daemon_json": {}},
     {"host.docker": ["ok"], "host.toolkit": ["ok"], "host.cdi": ["ok"]}, ""),
    ("no way to GPUs", info(Runtimes=RUNC_ONLY), {"toolkit": None, "daemon_json": {}},
     {"host.docker": ["error"]}, FIX_CONTAINER_TOOLKIT),
    ("snap", info(DockerRootDir="/var/snap/docker/common/var-lib-docker"), {},
     {"host.docker": ["error"]}, FIX_SNAP_DOCKER),
    ("Docker 18.09", info(ServerVersion="18.09.7"), {}, {"host.docker": ["error"]}, "19.03"),
    ("configured, not restarted", info(Runtimes=RUNC_ONLY), {},
     {"host.docker": ["error"]}, "restart"),
    ("rootless with the hook's cgroups", info(SecurityOptions=ROOTLESS), {},
     {"host.docker": ["ok"], "host.toolkit": ["error"]}, FIX_ROOTLESS),
    ("rootless, no-cgroups", info(SecurityOptions=ROOTLESS), {"toolkit": NO_CGROUPS},
     {"host.docker": ["ok"], "host.toolkit": ["ok"]}, ""),
    ("rootful, no-cgroups", info(), {"toolkit": NO_CGROUPS},
     {"host.docker": ["ok"], "host.toolkit": ["warn"]}, "rootless Docker only"),
    ("systemd and the hook", info(CgroupDriver="systemd"), {},
     {"host.docker": ["ok"], "host.toolkit": ["warn"]}, FIX_SYSTEMD_RELOAD),
    ("systemd, the /dev/char links made", info(CgroupDriver="systemd"), {"dev_char": True},
     {"host.docker": ["ok"], "host.toolkit": ["ok"]}, ""),
    ("cgroup v2, libnvidia-container 1.7", info(), {"libnvidia_container": "1.7.0"},
     {"host.docker": ["ok"], "host.toolkit": ["error"]}, "1.8.0"),
    ("cgroup v1, libnvidia-container 1.7", info(CgroupVersion="1"),
     {"libnvidia_container": "1.7.0"}, {"host.docker": ["ok"], "host.toolkit": ["ok"]}, ""),
    ("mode cdi, no spec", info(), {"toolkit": TOOLKIT.replace('"auto"', '"cdi"')},
     {"host.docker": ["ok"], "host.toolkit": ["error"]}, FIX_REGENERATE_CDI),
    ("mode csv on a discrete GPU", info(), {"toolkit": TOOLKIT.replace('"auto"', '"csv"')},
     {"host.docker": ["ok"], "host.toolkit": ["error"]}, "Tegra"),
    ("mode misspelt", info(), {"toolkit": TOOLKIT.replace('"auto"', '"legacyy"')},
     {"host.docker": ["ok"], "host.toolkit": ["error"]}, 'mode = "auto"'),
    ("ldconfig not on the host", info(),
     {"toolkit": TOOLKIT.replace("@/sbin/ldconfig.real", "@/sbin/ldconfig.nope")},
     {"host.docker": ["ok"], "host.toolkit": ["error"]}, "ldconfig.real"),
    ("config.toml broken", info(), {"toolkit": "[nvidia-container-cli\nno-cgroups = "},
     {"host.docker": ["ok"], "host.toolkit": ["warn"]}, "config default"),
    ("CDI spec from an older driver", info(), {"cdi": cdi_spec(4, driver="535.129.03")},
     {"host.docker": ["ok"], "host.toolkit": ["ok"], "host.cdi": ["error"]}, FIX_REGENERATE_CDI),
    ("CDI spec of fewer GPUs", info(), {"cdi": cdi_spec(2)},
     {"host.docker": ["ok"], "host.toolkit": ["ok"], "host.cdi": ["warn"]}, FIX_REGENERATE_CDI),
    ("CDI spec naming a GPU that is gone", info(), {"cdi": cdi_spec(4), "gpus": 3},
     {"host.docker": ["ok"], "host.toolkit": ["ok"], "host.cdi": ["error"]}, "/dev/nvidia3"),
])
def test_each_combination(use_fake_nvml: Install, tmp_path: Path, name: str,
                          answer: dict[str, Any], facts: dict[str, Any],
                          expected: dict[str, list[str]], fix: str) -> None:
    use_fake_nvml(fake_with(1))
    checks = judged(tmp_path, answer, **facts)
    assert statuses(checks) == expected, (name, checks)
    flagged = [c for cs in checks.values() for c in cs if c.status != "ok"]
    for c in flagged:
        assert c.found and c.expected and c.fix, c
    if fix:
        assert any(fix in c.fix or fix in c.found for c in flagged), (name, flagged)


def test_a_daemon_this_user_may_not_reach(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(1))
    checks = judged(tmp_path, None, error="permission denied while trying to connect to the "
                    "Docker daemon socket at unix:///var/run/docker.sock")
    (check,) = checks["host.docker"]
    assert check.status == "warn" and "usermod -aG docker" in check.fix


def test_no_docker_on_path(tmp_path: Path) -> None:
    with host_root(tmp_path):
        found = dockerhost.collect(str(tmp_path))
    assert not found.info.ok and "no docker command" in (found.info.error or "")


def test_a_rootless_daemon_reads_its_own_daemon_json(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    machine(tmp_path / "host")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/home/ada/.config")
    path = docker_command(tmp_path / "bin", info(SecurityOptions=ROOTLESS))
    with host_root(tmp_path / "host"):
        found = dockerhost.collect(path)
    assert found.daemon_json_path == "/home/ada/.config/docker/daemon.json"
    assert found.daemon_json.value == {}  # not written there yet


def test_the_probe_reads_what_docker_and_the_files_say(tmp_path: Path) -> None:
    machine(tmp_path / "host", cdi=cdi_spec(2), dev_char=True)
    path = docker_command(tmp_path / "bin", info(CgroupDriver="systemd"))
    with host_root(tmp_path / "host"):
        found = dockerhost.collect(path)
    assert found.info.value == dockerhost.DaemonInfo(
        "27.3.1", False, "systemd", "2", ("io.containerd.runc.v2", "nvidia", "runc"), "runc",
        ("/etc/cdi", "/var/run/cdi"), "/var/lib/docker")
    assert found.toolkit.value == dockerhost.ToolkitConfig("auto", False, True,
                                                           "@/sbin/ldconfig.real")
    (spec,) = found.cdi_specs
    assert spec.devices == ("0", "1", "all") and "/dev/nvidia1" in spec.device_nodes
    assert found.libnvidia_container == "1.17.3" and found.driver_version == DRIVER
    assert found.host_gpus == ("nvidia0", "nvidia1", "nvidia2", "nvidia3")
    assert found.dev_char_links == 4 and found.ready


def test_not_asked_in_a_container_or_without_the_gpu_compose_file(
    use_fake_nvml: Install,
) -> None:
    use_fake_nvml(fake_with(1))
    gpu_file = {"COMPOSE_FILE": "docker-compose.yml:docker-compose.gpu.yml"}
    inside = make_facts("all", environ=gpu_file)  # healthy_host: in a container
    assert inside.docker is None and check_docker(inside) == []


def test_a_podman_behind_the_docker_command_is_named(use_fake_nvml: Install,
                                                    tmp_path: Path) -> None:
    use_fake_nvml(fake_with(1))
    podman = {"host": {"arch": "amd64", "cgroupVersion": "v2", "ociRuntime": {"name": "crun"}},
              "store": {"graphDriverName": "overlay"}, "version": {"Version": "4.9.3"}}
    (check,) = judged(tmp_path, podman)["host.docker"]
    assert check.status == "warn" and "Podman" in check.found and "CDI" in check.found


def test_a_cdi_spec_the_daemon_cannot_read(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(1))
    (tmp_path / "host/etc/cdi/nvidia.yaml").mkdir(parents=True)  # read() fails: EISDIR
    checks = judged(tmp_path, info(SecurityOptions=ROOTLESS), toolkit=NO_CGROUPS)
    assert statuses(checks)["host.cdi"] == ["warn"]
    assert "cdi-spec-dirs" in checks["host.cdi"][0].fix


def test_envvar_refused_when_unprivileged_is_said(use_fake_nvml: Install,
                                                  tmp_path: Path) -> None:
    use_fake_nvml(fake_with(1))
    refusing = TOOLKIT.replace("#accept-nvidia-visible-devices-envvar-when-unprivileged = true",
                               "accept-nvidia-visible-devices-envvar-when-unprivileged = false")
    (check,) = judged(tmp_path, info(), toolkit=refusing)["host.toolkit"]
    assert check.status == "ok" and "NVIDIA_VISIBLE_DEVICES alone gives no GPUs" in check.found
