"""Simulate one catalogue thread on this machine and judge what `mgpu doctor` says about it.

NVML is the fake (tests/fake_nvml.py); CUDA's driver, the NVIDIA libraries and TensorFlow's
GPU discovery are real processes meeting gcc-built fakes through the real dynamic loader
(tests/fakecuda.py); the host facts (/dev, /proc, /sys, docker) are given. The doctor then
runs as `mgpu doctor` does (`diagnose`, the table as it is printed), and `Outcome` says
whether it detected the failure, named its cause and printed the thread's fix.

Written against interfaces that older versions of the doctor have too (a probe missing
there is simply not replaced), so the same catalogue measures them (`measure.py`).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import mgpu_env
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Diagnosis, diagnose
from mgpu_env.doctor import facts as probes
from mgpu_env.hardware import cudalibs, nvml
from mgpu_env.hardware.nvml import Probed
from tests.catalogue.threads import Thread
from tests.support.fake_nvml import FakeGpu, FakeNvml
from tests.support.fakecuda import build_cuda_library, build_libcuda, build_library, build_site


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


cudadriver = _optional("mgpu_env.hardware.cudadriver")
# TensorFlow's probes: in tfprobes/ since issue 33, in hardware/ before.
tfprobe = _optional("mgpu_env.tfprobes.tfprobe") or _optional("mgpu_env.hardware.tfprobe")
tflog = _optional("mgpu_env.tfprobes.tflog") or _optional("mgpu_env.hardware.tflog")
hostfacts = _optional("mgpu_env.hardware.hostfacts")
# The real probes, taken before any test fixture replaces them.
REAL = {"tf": tfprobe.collect, "cuda": cudalibs.collect,
        "driver": getattr(cudadriver, "collect", None)}
GIB = 1024**3
HEALTHY_HOST: dict[str, Any] = {
    "in_container": True,
    "device_files": ("nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"),
    "euid": 1000,
    "wsl_gpu": False,
    "nvidia_modules": ("nvidia", "nvidia_modeset", "nvidia_uvm"),
}


@dataclass(frozen=True)
class Outcome:
    thread: Thread
    detected: bool  # an error (a warning for a warning-level thread) before training
    cause_named: bool  # every cause word in a flagged check's finding or fix
    fix_printed: bool  # the thread's fix, whole, in the printed table
    status: str  # the named check's status ("missing": no such check)
    fix: str  # the thread's fix with the simulation's folders
    table: str

    @property
    def all(self) -> bool:
        return self.detected and self.cause_named and self.fix_printed


def _host(overrides: dict[str, Any], machine: Any = None) -> Any:
    from mgpu_env.doctor.facts import HostFacts

    known = {f.name for f in dataclasses.fields(HostFacts)}
    values = {**HEALTHY_HOST, **overrides}
    host = {k: Probed(value=v) for k, v in values.items() if k in known}
    if "limits" in known:
        # The machine's limits as the probe reads them from files (shm_bytes: /dev/shm's size).
        from tests.support.fakelimits import GIB as _GIB
        from tests.support.fakelimits import healthy_limits

        host["limits"] = healthy_limits(values.get("shm_bytes", 8 * _GIB))
    if machine is not None and "nvidia" in known:
        # What the fake tree shows: the kernel's GPUs and the device files, as probed.
        host.update(nvidia=machine, host_gpus=Probed(value=len(machine.gpu_bus_ids)))
        if "device_files" not in overrides:
            host["device_files"] = Probed(value=tuple(
                f.name for f in machine.device_files.value or ()))
    return HostFacts(**host)


def _machine(scenario: Any, tmp: Path, patch: pytest.MonkeyPatch) -> Any:
    """The scenario's machine laid out under tmp/machine and probed as `mgpu doctor` does;
    None without one (or on a doctor without these probes)."""
    nvidiahost = _optional("mgpu_env.hardware.nvidiahost")
    if getattr(scenario, "machine", None) is None or nvidiahost is None:
        return None
    from tests.support.fakemachine import machine_root

    root = tmp / "machine"
    if not root.exists():
        machine_root(root, **scenario.machine)
        if hasattr(probes, "probe_nccl"):  # NCCL's interfaces are this machine's too
            real = probes.probe_nccl
            patch.setattr(probes, "probe_nccl",
                          lambda environ, root_=root: real(environ, root_), raising=False)
    return nvidiahost.collect(root, uid=1000, gids=(1000,))


def _versions() -> dict[str, Probed[str]]:
    return {name: Probed(value=value) for name, value in (
        ("Python", "3.12.3"), ("TensorFlow", "2.21.0"), ("Keras", "3.15.1"),
        ("tf_keras", "2.21.0"), ("NumPy", "2.4.6"), ("nvidia-ml-py", "13.615.71"),
        ("OS", "Ubuntu 24.04 LTS"))}


def _canned_tf(gpus: int) -> Any:
    build = tfprobe.TfBuildInfo(True, "12.5.1", "9",
                                ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90"))
    return tfprobe.TfFacts(
        version=Probed(value="2.21.0"), build=Probed(value=build),
        gpus=Probed(value=tuple(f"/physical_device:GPU:{i}" for i in range(gpus))),
        cudnn=Probed(value=tfprobe.CudnnLibrary("9.3.0", "/w/nvidia/cudnn/lib/libcudnn.so.9")),
    )


def _canned_stack(**changes: Any) -> Any:
    from tests.support.fake_doctor import cuda_stack

    return cuda_stack(**changes)


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{site}", str(tmp / "site")).replace("{tmp}", str(tmp))


def _unwrapped(text: str) -> str:
    return " ".join(text.split())


def set_up(thread: Thread, tmp: Path, patch: pytest.MonkeyPatch) -> tuple[Any, dict[str, str]]:
    """Lay out the machine `thread` describes; returns the settings and the environment."""
    scenario = thread.scenario
    gpu_fields = {f.name for f in dataclasses.fields(FakeGpu)}
    gpus = [FakeGpu(name=name, compute_capability=cc,
                    **{k: v for k, v in scenario.gpu.items() if k in gpu_fields})
            for name, cc in scenario.gpus]
    machine = getattr(scenario, "machine", None)
    if machine is not None:
        # NVML numbers the machine's GPUs by the bus ids its /sys shows.
        from tests.support.fakemachine import BUS_IDS

        for gpu, bus in zip(gpus, machine.get("gpus", BUS_IDS[:2]), strict=False):
            gpu.bus_id = "0000" + bus.upper()
    fake = FakeNvml(gpus=gpus, **{"driver_version": "555.42.06", "cuda_driver_version": 12050,
                                  **scenario.nvml})
    patch.setattr(nvml, "load_library", lambda: fake)
    patch.setattr(probes, "probe_host", lambda: _host(scenario.host, _machine(scenario, tmp,
                                                                              patch)))
    patch.setattr(probes, "probe_versions", _versions)
    if hostfacts is not None:
        p2p = {"iommu_groups": 0, "cmdline": "", "hypervisor": False, "acs": (),
               **scenario.p2p}
        host_p2p = hostfacts.P2pHost(Probed(value=p2p["iommu_groups"]),
                                     Probed(value=p2p["cmdline"]),
                                     Probed(value=p2p["hypervisor"]), Probed(value=p2p["acs"]))
        docker = {"runtimes": ("io.containerd.runc.v2", "nvidia", "runc"), "cdi": (),
                  "hook": None, "docker": "/usr/bin/docker", **(scenario.docker or {})}
        from tests.support.fake_doctor import docker_gpu

        answer = docker_gpu(runtimes=docker["runtimes"], hook=docker["hook"],
                            docker=docker["docker"])
        patch.setattr(probes, "probe_p2p", lambda bus_ids: host_p2p, raising=False)
        patch.setattr(probes, "probe_docker", lambda: answer, raising=False)
    folders: list[Path] = []
    if scenario.libcuda is not None:
        options = dict(scenario.libcuda)
        folder = tmp / options.pop("folder", "driver")
        options.setdefault("device_count", len(gpus))
        build_libcuda(folder, **options)
        folders.append(folder)
    for name, libraries in scenario.ld_path.items():
        folder = tmp / name
        for library, version in libraries.items():
            if library == "nvjitlink-12.1":
                build_library(folder, "libnvJitLink.so.12")  # without 12.5's symbols
            else:
                build_cuda_library(folder, library, version or None)
        folders.append(folder)
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "LD_LIBRARY_PATH": ":".join(str(f) for f in folders), **scenario.environ}
    if cudadriver is not None:
        patch.setattr(cudadriver, "collect", REAL["driver"])
    if scenario.site is not None:
        options = dict(scenario.site)
        if options.get("missing") == "all":
            options["missing"] = tuple(spec.name for spec in cudalibs.LIBRARIES)
        site = build_site(tmp / "site", **options)
        environ = site.environ(environ)
        # The children import the doctor this process runs (this checkout's), not another.
        environ["PYTHONPATH"] += os.pathsep + str(Path(mgpu_env.__file__).parents[1])
        patch.setattr(tfprobe, "collect", REAL["tf"])
        patch.setattr(cudalibs, "collect", REAL["cuda"])
    else:
        tf = _canned_tf(len(gpus) if getattr(scenario, "tf_gpus", None) is None
                        else scenario.tf_gpus)
        if getattr(scenario, "tf_log", ()):
            tf = dataclasses.replace(tf, log=tflog.relevant_lines(
                "\n".join(scenario.tf_log)))
        stack = _canned_stack(**scenario.canned)
        patch.setattr(tfprobe, "collect", lambda env, timeout_s=0: tf)
        patch.setattr(cudalibs, "collect", lambda env, timeout_s=0: stack)
    settings = resolve_settings({"GPUS": "all", **scenario.settings}, environ)
    return settings, environ


def render_table(report: Diagnosis) -> str:
    from rich.console import Console

    from entrypoint.doctor import render

    out = io.StringIO()
    render(report, Console(file=out, width=100, no_color=True, force_terminal=False),
           strict=False)
    return out.getvalue()


def judge(thread: Thread, report: Diagnosis, table: str, tmp: Path) -> Outcome:
    flagged = [c for c in report.checks if c.status in ("warn", "error")]
    detected = bool(report.errors) if thread.status == "error" else bool(flagged)
    said = " ".join(f"{c.found} {c.fix}" for c in flagged).lower()
    cause = all(word.lower() in said for word in thread.cause)
    fix = _fill(thread.fix, tmp)
    named = [c for c in report.checks if c.id == thread.check
             or c.id.startswith(thread.check + ".")]
    return Outcome(
        thread, detected, cause, _unwrapped(fix) in _unwrapped(table),
        named[0].status if named else "missing", fix, table,
    )


def simulate(thread: Thread, tmp: Path, patch: pytest.MonkeyPatch) -> tuple[Outcome, Diagnosis]:
    """Simulate `thread` in `tmp` and run the doctor on it."""
    settings, environ = set_up(thread, tmp, patch)
    report = diagnose(settings, environ)
    return judge(thread, report, render_table(report), tmp), report
