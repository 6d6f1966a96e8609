"""Docker's host side, as far as it decides whether a container gets its GPUs.

How the daemon runs (`docker info`: rootless or rootful, its cgroup driver and version, its
runtimes), the NVIDIA Container Toolkit's configuration
(/etc/nvidia-container-runtime/config.toml), the daemon's own (/etc/docker/daemon.json, a
rootless daemon's ~/.config/docker/daemon.json), the CDI specs (/etc/cdi, /var/run/cdi) and
what they name, libnvidia-container's version, and the /dev/char links the toolkit's workaround
for systemd's cgroup driver creates.

`docker info` is one small probe (`run_docker_info`) that runs whichever `docker` is first on
PATH, so tests put a script there that answers as a real daemon does; every file is read
through `hostroot.host_path`. The judgement is the doctor's (`doctor/checks/dockerhost.py`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import Probed, probe

DOCKER_TIMEOUT_S = 4.0
CDI_FOLDERS = ("/etc/cdi", "/var/run/cdi")
HOOK = "nvidia-container-runtime-hook"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
DAEMON_JSON = "/etc/docker/daemon.json"
LIBRARY_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu",
                   "/usr/lib")


@dataclass(frozen=True)
class DaemonInfo:
    """The parts of `docker info --format '{{json .}}'` that decide GPU access."""

    server_version: str = ""
    rootless: bool = False  # SecurityOptions holds "name=rootless"
    cgroup_driver: str = ""  # cgroupfs, systemd, none
    cgroup_version: str = ""  # "1" or "2"
    runtimes: tuple[str, ...] = ()
    default_runtime: str = ""
    cdi_spec_dirs: tuple[str, ...] = ()  # Docker 25+: where it looks for CDI specs
    root_dir: str = ""  # DockerRootDir: a snap's lies under /var/snap/docker


@dataclass(frozen=True)
class ToolkitConfig:
    """The settings of the NVIDIA Container Toolkit's config.toml that decide GPU access,
    with the toolkit's defaults for what the file leaves out."""

    mode: str = "auto"  # nvidia-container-runtime.mode: auto, legacy, cdi, csv
    no_cgroups: bool = False  # nvidia-container-cli.no-cgroups
    accept_envvar_unprivileged: bool = True
    ldconfig: str = ""  # nvidia-container-cli.ldconfig ("@/sbin/ldconfig.real": a host path)


@dataclass(frozen=True)
class CdiSpec:
    """One CDI spec file for nvidia.com/gpu: its devices and the host files it names."""

    path: str
    devices: tuple[str, ...] = ()  # "0", "1", "GPU-<uuid>", "all"
    device_nodes: tuple[str, ...] = ()  # /dev/nvidia0, /dev/nvidiactl, ...
    host_paths: tuple[str, ...] = ()  # libraries and files it mounts
    error: str | None = None  # could not be read (a rootless daemon's user, say)
    missing: tuple[str, ...] = ()  # the device files and host files it names that are gone


@dataclass(frozen=True)
class DockerHost:
    """Everything on the host that decides whether Docker can give a container its GPUs."""

    docker: str | None = None  # the client's file, links resolved
    info: Probed[DaemonInfo] = field(default_factory=Probed)
    daemon_json: Probed[dict[str, Any]] = field(default_factory=lambda: Probed(value={}))
    daemon_json_path: str = DAEMON_JSON
    toolkit: Probed[ToolkitConfig | None] = field(default_factory=lambda: Probed(value=None))
    cdi_specs: tuple[CdiSpec, ...] = ()
    hook: str | None = None  # nvidia-container-runtime-hook on PATH
    libnvidia_container: str | None = None  # its version, from the library's file name
    driver_version: str | None = None  # the nvidia kernel module's
    host_gpus: tuple[str, ...] = ()  # /dev/nvidia<N> on the host
    dev_char_links: int = 0  # /dev/char links to NVIDIA devices (the #48 workaround)
    ldconfig_found: bool = True  # the host file config.toml's `ldconfig = "@..."` names

    @property
    def runtimes(self) -> tuple[str, ...]:
        return self.info.value.runtimes if self.info.ok and self.info.value else ()

    @property
    def ready(self) -> bool:
        """Some way to give containers GPUs: the NVIDIA runtime, a CDI spec, or the hook."""
        return ("nvidia" in self.runtimes or any(s.error is None for s in self.cdi_specs)
                or self.hook is not None)


def run_docker_info(docker: str, timeout_s: float = DOCKER_TIMEOUT_S) -> str:
    """`docker info --format '{{json .}}'`: the daemon's whole description as JSON."""
    done = subprocess.run([docker, "info", "--format", "{{json .}}"], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no answer"])[-1])
    return done.stdout


def parse_info(text: str) -> DaemonInfo:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("docker info answered something other than a JSON object")
    if "ServerVersion" not in data and "host" in data:
        # podman-docker's `docker` answers with Podman's own description.
        raise ValueError("this `docker` is Podman: it gives containers GPUs through CDI "
                         "(`nvidia-ctk cdi generate`, then `--device nvidia.com/gpu=all`), not "
                         "through Docker's runtimes")
    options = [str(o) for o in data.get("SecurityOptions") or ()]
    return DaemonInfo(
        server_version=str(data.get("ServerVersion", "")),
        rootless=any("name=rootless" in o for o in options),
        cgroup_driver=str(data.get("CgroupDriver", "")),
        cgroup_version=str(data.get("CgroupVersion", "")),
        runtimes=tuple(sorted(data.get("Runtimes") or {})),
        default_runtime=str(data.get("DefaultRuntime", "")),
        cdi_spec_dirs=tuple(str(d) for d in data.get("CDISpecDirs") or ()),
        root_dir=str(data.get("DockerRootDir", "")),
    )


def parse_toolkit_config(text: str) -> ToolkitConfig:
    data = tomllib.loads(text)
    cli = data.get("nvidia-container-cli", {})
    runtime = data.get("nvidia-container-runtime", {})
    return ToolkitConfig(
        mode=str(runtime.get("mode", "auto")),
        no_cgroups=bool(cli.get("no-cgroups", False)),
        accept_envvar_unprivileged=bool(
            data.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True)),
        ldconfig=str(cli.get("ldconfig", "")),
    )


def parse_cdi_spec(path: str, text: str) -> CdiSpec | None:
    """The spec's devices and host files; None when it is not for nvidia.com/gpu. YAML as
    `nvidia-ctk cdi generate` writes it, or JSON: read by their keys, line by line."""
    if not re.search(r"""["']?kind["']?\s*:\s*["']?nvidia\.com/gpu""", text):
        return None
    value = r"""["']?\s*:\s*["']?([^"',\s}]+)"""
    names = re.findall(r"""["']?name""" + value, text)
    paths = re.findall(r"""["']?path""" + value, text)
    host_paths = re.findall(r"""["']?hostPath""" + value, text)
    return CdiSpec(path, tuple(dict.fromkeys(names)),
                   tuple(dict.fromkeys(p for p in paths if p.startswith("/dev/"))),
                   tuple(dict.fromkeys(host_paths)))


def cdi_specs(folders: tuple[str, ...] = CDI_FOLDERS) -> tuple[CdiSpec, ...]:
    found: list[CdiSpec] = []
    for folder in dict.fromkeys(folders):
        where = host_path(folder)
        for spec in sorted(where.glob("*")) if where.is_dir() else ():
            if spec.suffix not in (".yaml", ".yml", ".json"):
                continue
            shown = f"{folder}/{spec.name}"
            try:
                parsed = parse_cdi_spec(shown, spec.read_text(errors="replace"))
            except OSError as err:
                found.append(CdiSpec(shown, error=err.strerror or str(err)))
                continue
            if parsed is not None:
                gone = tuple(p for p in parsed.device_nodes + parsed.host_paths
                             if p.startswith("/") and not host_path(p).exists())
                found.append(dataclasses.replace(parsed, missing=gone))
    return tuple(found)


def _read_json(path: str) -> dict[str, Any]:
    where = host_path(path)
    if not where.exists():
        return {}
    data = json.loads(where.read_text() or "{}")
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _toolkit() -> ToolkitConfig | None:
    where = host_path(TOOLKIT_CONFIG)
    return parse_toolkit_config(where.read_text()) if where.exists() else None


def libnvidia_container_version() -> str | None:
    """libnvidia-container's version from `libnvidia-container.so.1.<x>.<y>`."""
    for folder in LIBRARY_FOLDERS:
        where = host_path(folder)
        for library in sorted(where.glob("libnvidia-container.so.*")) if where.is_dir() else ():
            match = re.fullmatch(r"libnvidia-container\.so\.(\d+\.\d+\.\d+)", library.name)
            if match:
                return match.group(1)
    return None


def _driver_version() -> str | None:
    for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            text = host_path(path).read_text()
        except OSError:
            continue
        match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
        if match:
            return match.group(1)
    return None


def _dev_char_links() -> int:
    where = host_path("/dev/char")
    if not where.is_dir():
        return 0
    return sum(1 for link in where.iterdir()
               if link.is_symlink() and "nvidia" in os.readlink(link))


def _host_gpus() -> tuple[str, ...]:
    dev = host_path("/dev")
    return tuple(sorted(p.name for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)))


def _daemon_json_path(info: Probed[DaemonInfo]) -> str:
    """A rootless daemon reads its own daemon.json, under the user's config folder."""
    if info.value is not None and info.value.rootless:
        config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return f"{config}/docker/daemon.json"
    return DAEMON_JSON


def collect(path: str | None = None) -> DockerHost:
    """Docker's host side; `path` replaces PATH for finding docker and the hook."""
    docker = shutil.which("docker", path=path)
    info: Probed[DaemonInfo] = (
        probe(lambda: parse_info(run_docker_info(docker))) if docker
        else Probed(error="no docker command on PATH"))
    daemon_json_path = _daemon_json_path(info)
    dirs = info.value.cdi_spec_dirs if info.value and info.value.cdi_spec_dirs else ()
    toolkit = probe(_toolkit)
    ldconfig = toolkit.value.ldconfig if toolkit.value is not None else ""
    return DockerHost(
        docker=os.path.realpath(docker) if docker else None,
        info=info,
        daemon_json=probe(lambda: _read_json(daemon_json_path)),
        daemon_json_path=daemon_json_path,
        toolkit=toolkit,
        cdi_specs=cdi_specs(CDI_FOLDERS + dirs),
        hook=shutil.which(HOOK, path=path),
        libnvidia_container=libnvidia_container_version(),
        driver_version=_driver_version(),
        host_gpus=_host_gpus(),
        dev_char_links=_dev_char_links(),
        ldconfig_found=not ldconfig.startswith("@") or host_path(ldconfig[1:]).exists(),
    )
