"""Docker's host side, judged: whether Docker can give a container the GPUs.

Docker's host side, judged where the GPU compose file is selected on a host (not in a
container): whether Docker can give a container GPUs at all, each combination of the daemon
(rootless or rootful, its cgroup driver and version) and the NVIDIA Container Toolkit's
settings that cannot, and whether the CDI specs still match the GPUs and the driver.

Each rule cites the toolkit's documentation or the thread where NVIDIA gave the setting:
- rootless Docker needs `no-cgroups = true` (the toolkit's install guide, "Rootless mode");
  a rootful daemon with it leaves the device cgroup closed;
- the systemd cgroup driver with the toolkit's hook loses the GPUs at `systemctl
  daemon-reload` (`Failed to initialize NVML: Unknown Error`, NVIDIA/nvidia-container-toolkit#48):
  CDI, the cgroupfs driver, or the /dev/char links `nvidia-ctk system create-dev-char-symlinks`
  makes;
- cgroup v2 needs libnvidia-container 1.8.0 or later (`cgroup subsystem devices not found`,
  NVIDIA/nvidia-docker#1447, #1660);
- mode = "cdi" needs a CDI spec; mode = "csv" is for Tegra (Jetson) boards only;
- a spec made before a driver upgrade or a GPU change names files that are gone (regenerate:
  `nvidia-ctk cdi generate`); a rootless daemon cannot read /etc/cdi (moby#47676);
- Docker installed as a snap cannot use the toolkit; Docker before 19.03 has no `--gpus`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mgpu_env.doctor.checks.common import Check, CheckId, Status, check
from mgpu_env.doctor.facts import Facts

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
HOST_DOCKER = CheckId("host.docker")
HOST_TOOLKIT = CheckId("host.toolkit")
HOST_CDI = CheckId("host.cdi")

if TYPE_CHECKING:  # imported where Docker is asked (facts.probe_docker)
    from mgpu_env.hardware.dockerhost import DockerHost

FIX_CONTAINER_TOOLKIT = (
    "install the NVIDIA Container Toolkit "
    "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
    "install-guide.html), then `sudo nvidia-ctk runtime configure --runtime=docker` and "
    "`sudo systemctl restart docker`; or set `COMPOSE_FILE=docker-compose.yml` in .env to run "
    "on the CPU"
)
FIX_SNAP_DOCKER = (
    "Docker installed as a snap cannot use the NVIDIA Container Toolkit: remove it (`sudo "
    "snap remove docker`) and install Docker from Docker's apt repository, then the toolkit"
)
FIX_ROOTLESS = (
    "rootless Docker: `sudo nvidia-ctk config --set nvidia-container-cli.no-cgroups "
    "--in-place`, then `nvidia-ctk runtime configure --runtime=docker "
    "--config=$HOME/.config/docker/daemon.json` and `systemctl --user restart docker`"
)
FIX_SYSTEMD_RELOAD = (
    "use CDI (`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, mode = \"cdi\" in "
    "/etc/nvidia-container-runtime/config.toml), or `\"exec-opts\": "
    "[\"native.cgroupdriver=cgroupfs\"]` in /etc/docker/daemon.json, or run `sudo nvidia-ctk "
    "system create-dev-char-symlinks --create-all` at boot (NVIDIA/nvidia-container-toolkit#48)"
)
FIX_REGENERATE_CDI = (
    "regenerate the spec after every driver upgrade or GPU change: `sudo nvidia-ctk cdi "
    "generate --output=/etc/cdi/nvidia.yaml`"
)
TITLE = "Docker GPUs"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


@check(310, HOST_DOCKER)
def check_docker(facts: Facts) -> list[Check]:
    """Nothing unless the GPU compose file is selected on a host (not in a container)."""
    host = facts.docker
    if host is None:
        return []
    path = _gpu_path(host)
    if path.status == "error":  # no way to GPUs at all: what sits behind it cannot matter
        return [path]
    return [path, *_combinations(host), *_cdi(host)]


def _gpu_path(host: DockerHost) -> Check:
    """Whether Docker has any way to give containers GPUs."""
    expected = ("the NVIDIA runtime (`docker info`), a CDI spec for nvidia.com/gpu "
                "(/etc/cdi, /var/run/cdi), or nvidia-container-runtime-hook")
    if not host.info.ok or host.info.value is None:
        denied = "permission denied" in (host.info.error or "").lower()
        return HOST_DOCKER(
            TITLE, "warn", host.info.text(), expected,
            "this user may not use Docker's socket: `sudo usermod -aG docker $USER`, "
            "then log in again" if denied else
            "check that `docker info` answers (the daemon runs, this user may use "
            "it); COMPOSE_FILE selects docker-compose.gpu.yml")
    info = host.info.value
    specs = ", ".join(s.path for s in host.cdi_specs if s.error is None) or "none"
    found = (f"Docker {info.server_version or '?'} ({'rootless' if info.rootless else 'rootful'}"
             f", {info.cgroup_driver or '?'} cgroup driver, cgroup v{info.cgroup_version or '?'})"
             f"; runtimes: {', '.join(info.runtimes) or 'none'}; CDI specs: {specs}; "
             f"hook: {host.hook or 'not on PATH'}")
    snap = bool(host.docker and host.docker.startswith("/snap/")) or \
        info.root_dir.startswith("/var/snap/")
    refused = ("" if host.ready else " (docker-compose.gpu.yml is selected: Docker will refuse "
               'it: could not select device driver "" with capabilities: [[gpu]])')
    if snap:
        return HOST_DOCKER(TITLE, "error", found + refused, expected, FIX_SNAP_DOCKER)
    if info.server_version and _version(info.server_version) < (19, 3):
        return HOST_DOCKER(TITLE, "error", found + " (before 19.03: no --gpus)",
                           expected, "upgrade Docker (19.03 or later; 25 or later for CDI)")
    configured = host.daemon_json.value or {}
    if "nvidia" in (configured.get("runtimes") or {}) and "nvidia" not in info.runtimes:
        return HOST_DOCKER(
            TITLE, "error",
            f"{found} ({host.daemon_json_path} names the nvidia runtime, the running "
            "daemon does not: it was not restarted)", expected,
            "restart the daemon: `sudo systemctl restart docker` (rootless: "
            "`systemctl --user restart docker`)")
    if host.ready:
        return HOST_DOCKER(TITLE, "ok", found, expected)
    return HOST_DOCKER(TITLE, "error", found + refused, expected, FIX_CONTAINER_TOOLKIT)


def _legacy(host: DockerHost) -> bool:
    """Whether GPUs reach containers through the toolkit's hook (which sets the device cgroup
    itself) rather than through CDI."""
    toolkit = host.toolkit.value
    mode = toolkit.mode if toolkit is not None else "auto"
    return mode in ("legacy", "auto") and ("nvidia" in host.runtimes or host.hook is not None)


def _combinations(host: DockerHost) -> list[Check]:
    """The daemon and toolkit settings that cannot give a container its GPUs."""
    info = host.info.value
    if info is None or not host.ready:
        return []
    expected = "a daemon and toolkit settings that give containers GPUs (and keep them)"
    if not host.toolkit.ok:
        return [HOST_TOOLKIT("NVIDIA toolkit setup", "warn",
                             f"/etc/nvidia-container-runtime/config.toml: {host.toolkit.text()}",
                             expected, "fix the file's TOML, or regenerate it: `sudo nvidia-ctk "
                                       "config default --output=/etc/nvidia-container-runtime/"
                                       "config.toml`")]
    toolkit = host.toolkit.value
    found = (f"{'rootless' if info.rootless else 'rootful'} daemon, {info.cgroup_driver or '?'} "
             f"cgroup driver, cgroup v{info.cgroup_version or '?'}; toolkit: "
             + (f"mode {toolkit.mode}, no-cgroups {str(toolkit.no_cgroups).lower()}"
                if toolkit else "no config.toml (its defaults)")
             + (f", libnvidia-container {host.libnvidia_container}"
                if host.libnvidia_container else "")
             + ("; accept-nvidia-visible-devices-envvar-when-unprivileged = false: "
                "NVIDIA_VISIBLE_DEVICES alone gives no GPUs (--gpus, compose's devices and CDI "
                "do)" if toolkit and not toolkit.accept_envvar_unprivileged else ""))
    problems = _problems(host)
    if not problems:
        return [HOST_TOOLKIT("NVIDIA toolkit setup", "ok", found, expected)]
    return [HOST_TOOLKIT("NVIDIA toolkit setup", status, f"{found}: {why}", expected, fix)
            for status, why, fix in problems]


def _problems(host: DockerHost) -> list[tuple[Status, str, str]]:
    info, toolkit = host.info.value, host.toolkit.value
    assert info is not None
    problems: list[tuple[Status, str, str]] = []
    legacy = _legacy(host)
    no_cgroups = toolkit.no_cgroups if toolkit else False
    if info.rootless and legacy and not no_cgroups:
        problems.append(("error", "a rootless daemon cannot set the device cgroup the toolkit "
                         "asks for (`nvidia-container-cli: mount error: failed to add device "
                         "rules: ... bpf_prog_query(BPF_CGROUP_DEVICE) failed: operation not "
                         "permitted`)", FIX_ROOTLESS))
    if not info.rootless and legacy and no_cgroups:
        problems.append(("warn", "no-cgroups = true on a rootful daemon: the toolkit leaves "
                         "the device cgroup closed (`Failed to initialize NVML: Unknown "
                         "Error` in containers)", "`sudo nvidia-ctk config --set "
                         "nvidia-container-cli.no-cgroups=false --in-place` (true is for "
                         "rootless Docker only)"))
    if info.cgroup_driver == "systemd" and legacy and not host.dev_char_links:
        problems.append(("warn", "the systemd cgroup driver with the toolkit's hook: "
                         "containers lose their GPUs at the next `systemctl daemon-reload` "
                         "(`Failed to initialize NVML: Unknown Error`)", FIX_SYSTEMD_RELOAD))
    version = _version(host.libnvidia_container or "")
    if info.cgroup_version == "2" and version and version < (1, 8, 0):
        problems.append(("error", f"libnvidia-container {host.libnvidia_container} predates "
                         "cgroup v2 support (1.8.0): `nvidia-container-cli: container error: "
                         "cgroup subsystem devices not found`", "upgrade the NVIDIA Container "
                         "Toolkit (1.8.0 or later; `apt-get install nvidia-container-toolkit`)"))
    if toolkit is not None:
        problems += _mode_problems(host, toolkit.mode)
    return problems


def _mode_problems(host: DockerHost, mode: str) -> list[tuple[Status, str, str]]:
    problems: list[tuple[Status, str, str]] = []
    if mode == "cdi" and not any(s.error is None for s in host.cdi_specs):
        problems.append(("error", 'mode = "cdi" and no CDI spec for nvidia.com/gpu: '
                         "`unresolvable CDI devices nvidia.com/gpu=all`", FIX_REGENERATE_CDI))
    if mode == "csv" and host.host_gpus:
        problems.append(("error", 'mode = "csv" is for Tegra (Jetson) boards: this host\'s '
                         f"{len(host.host_gpus)} GPU(s) are not given to containers",
                         'set mode = "auto" (or "cdi") in /etc/nvidia-container-runtime/'
                         "config.toml"))
    if mode not in ("auto", "legacy", "cdi", "csv"):
        problems.append(("error", f"mode = {mode!r} is not one of auto, legacy, cdi, csv",
                         'set mode = "auto" in /etc/nvidia-container-runtime/config.toml'))
    if not host.ldconfig_found:
        ldconfig = host.toolkit.value.ldconfig if host.toolkit.value else ""
        problems.append(("error", f"ldconfig = {ldconfig!r} names no file on the host "
                         "(`nvidia-container-cli: ldconfig error`)",
                         "point ldconfig at the host's (`@/sbin/ldconfig.real` on Debian and "
                         "Ubuntu, `@/sbin/ldconfig` elsewhere)"))
    return problems


def _cdi(host: DockerHost) -> list[Check]:
    """Whether each CDI spec still matches the GPUs and the driver on the host."""
    if not host.cdi_specs:
        return []
    expected = "every spec's GPUs, device files and driver libraries present on the host"
    checks: list[Check] = []
    for spec in host.cdi_specs:
        if spec.error is not None:
            checks.append(HOST_CDI("CDI spec", "warn", f"{spec.path}: {spec.error}",
                                   expected, "a rootless daemon reads its specs as its user: "
                                   "generate them where it can read them and list that folder in "
                                   "daemon.json's cdi-spec-dirs (moby#47676)"))
            continue
        gpus = [d for d in spec.devices if d.isdigit()]
        missing = spec.missing
        found = f"{spec.path}: {len(gpus)} GPU(s) named, {len(host.host_gpus)} on the host"
        status: Status = "ok"
        if missing:
            status, found = "error", found + "; names files that are gone: " + ", ".join(
                missing[:4]) + (" (a driver upgrade since it was made)" if any(
                    "libcuda" in p or "libnvidia-ml" in p for p in missing) else "")
        elif len(gpus) < len(host.host_gpus):
            status, found = "warn", found + ": the GPUs beyond it cannot be given"
        checks.append(HOST_CDI("CDI spec", status, found, expected,
                               FIX_REGENERATE_CDI if status != "ok" else ""))
    return checks
