"""Shared fixtures: a fake NVML behind the probe layer, and a clean settings environment;
tests marked `gpu` are skipped, with the reason, on a machine whose NVML lists no GPU."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mgpu_env import api
from mgpu_env.config.settings import DECLARATIONS
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import cudalibs, nvml
from mgpu_env.hardware.cudalibs import CudaStack
from mgpu_env.runtime import record
from mgpu_env.tfprobes.tfprobe import TfFacts
from mgpu_env.training.step import memprobe
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakemachine import (
    REAL_DRIVER_COLLECT,
    REAL_PROBE_P2P,
    FakeHost,
    Machine,
    build_libcuda_versioned,
)
from tests.support.memory import REAL_MEASURE, canned_measure
from tests.support.runtimes import logical_cpu_devices, logical_cpus_applied


@pytest.hookimpl(optionalhook=True, wrapper=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> Generator[None, int, int]:
    """`-n auto`: one worker per CPU, and one more where Docker answers and the docker tests
    are not deselected. The container test holds its worker for minutes (~13 cold) while it
    mostly waits on downloads; the extra worker keeps the CPUs busy with the other tests
    meanwhile. PYTEST_XDIST_AUTO_NUM_WORKERS, when set, is taken as it is."""
    count = yield
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return count
    if "not docker" in (config.option.markexpr or ""):
        return count
    from tests.support.docker import docker_engine_missing

    return count if docker_engine_missing() else count + 1


# The modules where every test is long: the corpus runs public scripts to their end (some
# twice), the tutorials train 2 workers for 3 epochs of 70 steps; 22-78 s each on 2 busy
# cores with the bytecode compiled (other slow modules mix such tests with short ones).
# Among the slow tests they start first.
LONGEST_MODULES = frozenset({"test_keras2_scripts.py", "test_tutorials.py"})


def start_rank(item: pytest.Item) -> int:
    """When a test starts under `make test`: the Docker build first, then the longest modules,
    then the other tests that train or start processes (`slow`), then the rest. pytest-xdist
    hands tests out in collection order (an `xdist_group` as one unit); the suite ends when
    its last long test does, so a long test collected late is a tail with the other workers
    idle, while the many short tests left for the end fill the workers evenly."""
    if item.get_closest_marker("docker") is not None:
        return 0
    if item.get_closest_marker("slow") is None:
        return 3
    return 1 if item.path.name in LONGEST_MODULES else 2


def keep_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make `--dist loadgroup` send an `xdist_group`'s tests to one worker again.

    pytest-xdist 3.8 marks a grouped test by appending "@group" to `item._nodeid`, which
    pytest 9 no longer reads (its node ids are structured, `item._id`): the groups were
    silently ignored, so two workers each built the Docker image, and one worker's session
    end stopped the Slurm the other's tests were using (pytest-dev/pytest-xdist#1386, open;
    its fix, #1388, sets the structured id the same way). Runs in the workers only, where
    xdist sets `loadgroup`; a test already suffixed is left alone."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests by `start_rank`, then by their file's name whatever its folder (a
    stable sort: a file's tests keep their order), so the tree's folders change no test's turn.
    Skip the `gpu` tests where there is no GPU, saying why (NVML is asked once, and only
    when such a test was collected: `pytest -m gpu` on a GPU machine runs them)."""
    items.sort(key=lambda item: (start_rank(item), item.path.name))
    keep_xdist_groups(config, items)
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    listing = nvml.snapshot().listing
    if listing.gpus:
        return
    skip = pytest.mark.skip(reason=f"requires a GPU: {listing.error or 'NVML lists none'}")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def restore_environ() -> Iterator[None]:
    """Put os.environ back exactly after each test: the runtime writes CUDA_*, TF_CONFIG
    and a settings file's NCCL_* into it, which monkeypatch (it restores only what it
    changed itself) would let leak into the next test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    # A command run in-process (CliRunner) keeps its runtime as the process's
    # (`api.start_process`): the next test resolves its own.
    api._reset()


@pytest.fixture(autouse=True)
def clean_settings_env(
    restore_environ: None,
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """No setting leaks in from the developer's shell or a .env in the working folder."""
    for declaration in DECLARATIONS:
        monkeypatch.delenv(declaration.env, raising=False)
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_CONFIG", "MGPU_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    # What mgpu keeps between starts (a built-in model's memory estimate, a folder's counts)
    # goes to a cache of the test's own, inherited by its children: never the developer's,
    # and never another test's answer.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def canned_cuda_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor and the pre-flight see the CUDA user space the CUDA lock installs, not this
    machine's: tests that probe the real libraries call cudalibs' lower-level functions."""
    from tests.support.fake_doctor import cuda_stack

    monkeypatch.setattr(cudalibs, "collect", lambda environ, timeout_s=0: cuda_stack())
    monkeypatch.setattr(cudalibs, "collect_in_process", lambda environ=None: cuda_stack())
    # NCCL loads wherever GPUs are selected, as in the image (tests of the probe itself call
    # cudalibs.nccl_loadable directly).
    monkeypatch.setattr(record, "nccl_available", lambda gpus: bool(gpus))
    # CUDA's driver API initialises wherever NVML lists GPUs (tests of the probe itself, and
    # the catalogue of real failures, use fake libcuda.so.1 files built with gcc).
    from mgpu_env.hardware import cudadriver
    from tests.support.fake_doctor import driver_api

    monkeypatch.setattr(cudadriver, "collect", lambda environ, timeout_s=0: driver_api(environ))
    # A host that leaves P2P alone (no IOMMU translating, no ACS, no hypervisor), and a Docker
    # with the NVIDIA runtime: the tests of those probes give them a fake /sys or answers.
    from mgpu_env.doctor import facts as doctor_facts
    from tests.support.fake_doctor import docker_gpu, p2p_host

    monkeypatch.setattr(doctor_facts, "probe_p2p", lambda bus_ids: p2p_host())
    monkeypatch.setattr(doctor_facts, "probe_docker", lambda: docker_gpu())


@pytest.fixture(autouse=True)
def canned_memory_child(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory check's child answers from `tests.support.memory` (no TensorFlow import
    in a child per dry run); tests that take `real_memory_child` start the real one."""
    if "real_memory_child" not in request.fixturenames:
        monkeypatch.setattr(memprobe, "measure_in_child", canned_measure)


@pytest.fixture
def real_memory_child() -> Callable[..., object]:
    """The real `memprobe.measure_in_child` (the canned one is not installed)."""
    return REAL_MEASURE


@pytest.fixture
def canned_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor's host and version probes answer as a healthy host with the pinned
    libraries: the modules that run `mgpu doctor` take it for every test
    (`pytestmark = pytest.mark.usefixtures("canned_host")`)."""
    from mgpu_env.doctor import facts as doctor_facts
    from tests.support.fake_doctor import healthy_host, versions

    monkeypatch.setattr(doctor_facts, "probe_host", lambda: healthy_host())
    monkeypatch.setattr(doctor_facts, "probe_versions", lambda: versions())


@pytest.fixture
def use_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[FakeNvml], FakeNvml]]:
    """Install a fake NVML: `use_fake_nvml(fake_with(2))`."""

    def install(fake: FakeNvml) -> FakeNvml:
        monkeypatch.setattr(nvml, "load_library", lambda: fake)
        return fake

    yield install


@pytest.fixture
def two_gpus(use_fake_nvml: Callable[[FakeNvml], FakeNvml]) -> FakeNvml:
    return use_fake_nvml(fake_with(2))


@pytest.fixture(scope="session")
def logical_cpus() -> tuple[str, ...]:
    pytest.importorskip("tensorflow")
    return logical_cpu_devices()


_REPORTED = {"unsplit": False}  # the guard below names one test per process


@pytest.fixture(autouse=True)
def tensorflow_devices_split_first(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that starts TensorFlow's devices in this process without taking
    `logical_cpus` first: TensorFlow splits a device only before its devices start, so every
    in-process test that the same xdist worker runs after it, in whatever order the suite
    hands them out, would fail to split ("Virtual devices cannot be modified after being
    initialized")."""
    yield
    context = sys.modules.get("tensorflow.python.eager.context")
    started = context is not None and getattr(context, "_context", None) is not None and (
        getattr(context._context, "_physical_devices", None) is not None
    )
    if started and not logical_cpus_applied() and not _REPORTED["unsplit"]:
        _REPORTED["unsplit"] = True  # reported once, by the test that did it
        pytest.fail("this test started TensorFlow's devices in the test process without "
                    "the `logical_cpus` fixture: take it (or `tests.support.runtimes."
                    "split_tensorflow()` in a helper, or run TensorFlow in a child)")


@pytest.fixture
def fake_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    use_fake_nvml: Callable[[FakeNvml], FakeNvml],
) -> Iterator[Callable[..., FakeHost]]:
    """A whole machine below the doctor: `fake_machine(Machine(...), nvml=..., libcuda=...)`
    lays out /proc, /sys, /dev, /etc and the process's identity under a folder and points
    MGPU_HOST_ROOT at it, installs the fake NVML (by default: the GPUs the module attached,
    with their bus ids) and a gcc-built libcuda.so.1 that CUDA's driver probe (the real one,
    in a child) loads. A probe that reads the real /proc, /sys, /dev or /etc meanwhile fails
    the test (`tests.support.hostaudit`)."""
    from mgpu_env.doctor import facts as doctor_facts
    from mgpu_env.hardware import cpu, cudadriver
    from tests.support import hostaudit
    from tests.support.fakemachine import build, machine_nvml

    made: list[Path] = []

    def make(machine: Machine | None = None, *, nvml: FakeNvml | None = None,
             libcuda: dict[str, int] | None = None, libcuda_folder: str = "driver",
             ) -> FakeHost:
        machine = machine or Machine()
        root = build(tmp_path / f"machine{len(made) or ''}", machine)
        made.append(root)
        monkeypatch.setenv("MGPU_HOST_ROOT", str(root))
        use_fake_nvml(nvml if nvml is not None else machine_nvml(machine))
        folder = tmp_path / f"{libcuda_folder}{len(made) - 1 or ''}"
        options = {"device_count": len(machine.usable), **(libcuda or {})}
        build_libcuda_versioned(folder, machine.library, **options)
        monkeypatch.setattr(cudadriver, "collect", REAL_DRIVER_COLLECT)
        monkeypatch.setattr(doctor_facts, "probe_p2p", REAL_PROBE_P2P)
        cpu.cpu_flags.cache_clear()
        hostaudit.watch(root)
        return FakeHost(root, {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                               "LD_LIBRARY_PATH": str(folder)})

    yield make
    reads = hostaudit.stop()
    cpu.cpu_flags.cache_clear()
    assert not reads, f"a probe read the real machine around the fake one: {reads[:8]}"


@pytest.fixture
def machine_facts(fake_machine: Callable[..., FakeHost]) -> Callable[..., Facts]:
    """`make_facts` without replacing a probe: the facts `gather` reads from a healthy fake
    machine (`fake_machine`) whose GPUs are those of the fake NVML the test installed (by
    their bus ids). `tf` and `cuda` are handed to `gather` as its collectors."""
    from mgpu_env.config.resolve import resolve_settings
    from mgpu_env.doctor import gather
    from mgpu_env.doctor.diagnosis import ChildProbes
    from mgpu_env.hardware.pcibus import short_bus_id
    from tests.support.fake_doctor import cuda_stack

    def facts(gpus_setting: str = "all", *, tf: TfFacts | None = None,
              environ: dict[str, str] | None = None, mixed_precision: str = "0",
              cuda: CudaStack | None = None, settings: dict[str, str] | None = None,
              xla: bool = False, cross_device_ops: str = "auto", **machine: Any) -> Facts:
        fake = nvml.load_library()
        gpus = tuple(short_bus_id(g.bus_id) for g in getattr(fake, "gpus", ()))
        host = fake_machine(Machine(gpus=gpus, **machine), nvml=fake)
        env = {**host.environ, **(environ or {})}
        resolved = resolve_settings({"GPUS": gpus_setting, "MIXED_PRECISION": mixed_precision,
                                     "XLA": "1" if xla else "0",
                                     "CROSS_DEVICE_OPS": cross_device_ops, **(settings or {})},
                                    env)
        return gather(resolved, env, with_tensorflow=tf is not None,
                      children=ChildProbes(
                          tensorflow=(lambda e: tf) if tf is not None else None,
                          cuda=lambda e: cuda or cuda_stack()))

    return facts
