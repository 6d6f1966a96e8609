"""The chain's job layers on fake machines: what Slurm, Kubernetes or the container gave the
job, GPUS within it, other processes' memory, CUDA, and a TensorFlow probe child that dies by
a signal or says only harmless start-up lines (the stand-in TensorFlow in
tests/fixtures/signal_tensorflow, imported by the real probe child)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import mgpu_env
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Check, Diagnosis, diagnose
from mgpu_env.doctor.chain import build
from mgpu_env.hardware import childprobe, cudaerrors
from tests.support.fakemachine import FakeHost, Machine, bus_ids, machine_nvml

MakeMachine = Callable[..., FakeHost]
FOUR = bus_ids(4)
STANDIN = Path(__file__).parents[1] / "fixtures/signal_tensorflow"


def doctor(host: FakeHost, settings: dict[str, str] | None = None,
           environ: dict[str, str] | None = None, *, tf: bool = False) -> Diagnosis:
    env = {**host.environ, **(environ or {})}
    if tf:
        env["PYTHONPATH"] = os.pathsep.join((str(STANDIN), str(Path(mgpu_env.__file__)
                                                               .parents[1])))
    return diagnose(resolve_settings({"GPUS": "all", **(settings or {})}, env), env,
                    with_tensorflow=tf)


def lines(report: Diagnosis) -> dict[str, Check]:
    return {c.id: c for c in report.checks if c.id == "chain" or c.id.startswith("chain.")}


# ------------------------------------------------------ the job's assignment, and GPUS


def test_slurm_job_given_two_of_four_with_its_cuda_visible_devices(
        fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR), libcuda={"device_count": 2})
    environ = {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}
    report = doctor(host, environ=environ)
    chain = lines(report)
    assert list(chain) == ["chain"] and chain["chain"].status == "ok", chain
    assert "this job 2 -> GPUS 2 -> CUDA 2" in chain["chain"].found
    assert "2 not given to this job (Slurm: SLURM_JOB_GPUS=2,3)" in chain["chain"].found


def test_gpus_selects_within_the_assignment_by_position(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR), libcuda={"device_count": 1})
    report = doctor(host, {"GPUS": "1"}, {"SLURM_JOB_GPUS": "2,3",
                                          "CUDA_VISIBLE_DEVICES": "2,3"})
    assert [g.index for g in report.facts.selected] == [3]
    assert report.facts.selection is not None
    assert report.facts.selection.cuda_visible_devices == "3"
    assert "selects within CUDA_VISIBLE_DEVICES='2,3'" in (report.facts.selection.note or "")
    assert not [c for c in lines(report).values() if c.status != "ok"]


def test_gpus_beyond_the_assignment_is_refused(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR))
    report = doctor(host, {"GPUS": "2"}, {"CUDA_VISIBLE_DEVICES": "2,3"})
    request = next(c for c in report.checks if c.id == "visible.request")
    assert request.status == "error" and "position 2 is beyond them (valid: 0..1)" in \
        request.found


def test_slurm_without_cuda_visible_devices_is_not_widened(fake_machine: MakeMachine) -> None:
    # The job's cgroup does not constrain the devices and nothing set CUDA_VISIBLE_DEVICES:
    # GPUS=all would reach the other job's GPUs.
    host = fake_machine(Machine(gpus=FOUR))
    chain = lines(doctor(host, environ={"SLURM_STEP_GPUS": "0,1"}))
    lost = chain["chain.gpus"]
    assert lost.status == "error" and FOUR[2] in lost.found and FOUR[3] in lost.found
    assert "SLURM_STEP_GPUS=0,1" in lost.found and "GPUS counts positions" in lost.fix


def test_privileged_container_sees_more_than_it_was_given(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR, container=True), libcuda={"device_count": 1})
    report = doctor(host, environ={"NVIDIA_VISIBLE_DEVICES": "1",
                                   "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    chain = lines(report)
    assert "--privileged" in chain["chain.job"].found
    assert [g.index for g in report.facts.selected] == [0, 1, 2, 3]
    assert chain["chain.gpus"].status == "error"  # GPUS=all reaches the other three
    assert "Kubernetes: NVIDIA_VISIBLE_DEVICES=1" in chain["chain.gpus"].found


def test_unreadable_slurm_value_is_said(fake_machine: MakeMachine) -> None:
    chain = lines(doctor(fake_machine(Machine(gpus=FOUR)),
                         environ={"SLURM_JOB_GPUS": "gpu:a100:2"}))
    assert "not a GPU index" in chain["chain.job"].found


def test_other_processes_memory_is_named(fake_machine: MakeMachine) -> None:
    # pid 1001 is another container's: not in this /proc, so only its number is known.
    machine = Machine(gpus=FOUR, processes={1000: "python3"})
    nvml = machine_nvml(machine)
    nvml.gpus[1].processes = 2
    chain = lines(doctor(fake_machine(machine, nvml=nvml)))
    warned = chain["chain.job"]
    assert warned.status == "warn"
    assert "python3 (pid 1000, 1024 MiB), pid 1001 (1024 MiB)" in warned.found
    assert warned.found.startswith(f"GPU 1 ({FOUR[1]})")


# ------------------------------------------------- CUDA, and the TensorFlow probe child


def test_cuinit_failure_is_counted_and_left_to_its_line(fake_machine: MakeMachine) -> None:
    report = doctor(fake_machine(Machine(gpus=FOUR), libcuda={"init_code": 999}))
    chain = lines(report)
    assert chain["chain"].status == "skip"  # one cause, one error: the CUDA driver line's
    assert "4 lost at CUDA: see the CUDA driver line" in chain["chain"].found
    assert next(c for c in report.checks if c.id == "driver.cuda_init").status == "error"


@pytest.mark.parametrize(("flags", "words"), [
    (("sse", "sse2", "sse4_2"), ("killed by SIGILL", "lack AVX", "host-passthrough")),
    (("sse", "avx"), ("killed by SIGILL", "although it has AVX (it lacks AVX2, FMA)")),
])
def test_tensorflow_child_killed_by_sigill_reads_the_cpu_flags(
        fake_machine: MakeMachine, flags: tuple[str, ...], words: tuple[str, ...]) -> None:
    host = fake_machine(Machine(gpus=FOUR, cpu_flags=flags))
    report = doctor(host, environ={"STANDIN_SIGNAL": str(int(signal.SIGILL))}, tf=True)
    tf = report.facts.tensorflow
    assert tf is not None
    assert all(w in (tf.gpus.error or "") for w in words), tf.gpus.error
    assert "4 lost at TensorFlow" in lines(report)["chain"].found


def test_tensorflow_child_killed_by_sigkill_reads_the_oom_count(
        fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR, oom_kills=3))
    report = doctor(host, environ={"STANDIN_SIGNAL": str(int(signal.SIGKILL))}, tf=True)
    error = report.facts.tensorflow.gpus.error if report.facts.tensorflow else ""
    assert "killed by SIGKILL" in (error or "") and "counts 3 oom_kill" in (error or "")


def test_start_up_noise_is_never_the_cause(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR))
    report = doctor(host, environ={"STANDIN_GPUS": "0"}, tf=True)
    tf = report.facts.tensorflow
    assert tf is not None and tf.log == ()
    said = " ".join(f"{c.found} {c.fix}" for c in report.checks if c.status != "ok")
    for noise in ("register cuDNN", "NUMA", "optimized to use available CPU", "oneDNN",
                  "TensorRT"):
        assert noise not in said, noise
    layer = build(report.facts).layer("TensorFlow")
    assert layer is not None and layer.count == 0
    assert "dropped between CUDA and TensorFlow" in layer.drops[0].cause
    assert "only start-up notices, which are not causes" in layer.drops[0].cause


def test_a_real_cause_among_the_noise_is_the_one_named(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR))
    log = ("2026-12-02 20:00:00.000009: E external/local_xla/xla/stream_executor/cuda/"
           "cuda_driver.cc:152] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable "
           "device is detected")
    report = doctor(host, environ={"STANDIN_GPUS": "0", "STANDIN_LOG": log}, tf=True)
    tf = report.facts.tensorflow
    assert tf is not None and len(tf.log) == 1 and "cuInit" in tf.log[0]
    layer = build(report.facts).layer("TensorFlow")
    assert layer is not None and layer.drops[0].cause == cudaerrors.describe(100).cause
    assert layer.drops[0].known and "NUMA" not in layer.drops[0].cause


def test_a_real_child_killed_by_each_signal_is_named(tmp_path: Path) -> None:
    for number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGTERM):
        done = childprobe.ask(
            ["python3", "-c", f"import os, signal; os.kill(os.getpid(), {int(number)})"],
            {"PATH": os.environ["PATH"]}, marker="@@", timeout_s=30)
        assert done.returncode == -number
        assert f"was killed by {number.name}: " in done.exited("the probe")


def test_counts_agree_from_the_bus_to_tensorflow(fake_machine: MakeMachine) -> None:
    host = fake_machine(Machine(gpus=FOUR))
    report = doctor(host, environ={"STANDIN_GPUS": "4"}, tf=True)
    chain = lines(report)
    assert list(chain) == ["chain"] and chain["chain"].status == "ok", chain
    assert chain["chain"].found == (
        "PCI bus 4 -> kernel driver 4 -> nvidia module 4 -> device files 4 -> user-space "
        "driver 4 -> NVML 4 -> this job 4 -> GPUS 4 -> CUDA 4 -> TensorFlow 4")
