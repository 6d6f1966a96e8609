"""TensorFlow's own words kept and reasoned about: the "Ignoring visible gpu device" line is
never filtered and becomes the cause; a library TensorFlow could not open that the doctor's
probe loaded is a search-path fault, with the folder to add."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mgpu_env.doctor.checks import check_tf_devices
from mgpu_env.doctor.facts import Facts
from mgpu_env.tfprobes import tflog
from tests.support.fake_doctor import WHEELS, tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with

Install = Callable[[FakeNvml], FakeNvml]
MachineFacts = Callable[..., Facts]
NOISE = "2026-01-01 10:00:00.000001: I tensorflow/core/platform/cpu_feature_guard.cc:210] " \
        "This TensorFlow binary is optimized to use available CPU instructions"
CORES = ("2026-01-01 10:00:01.000002: I tensorflow/core/common_runtime/gpu/gpu_device.cc:2022] "
         "Ignoring visible gpu device (device: 1, name: NVIDIA GeForce GT 1030, pci bus id: "
         "0000:02:00.0, compute capability: 6.1) with core count: 3. The minimum required "
         "count is 8. You can adjust this requirement with the env var "
         "TF_MIN_GPU_MULTIPROCESSOR_COUNT.")
CAPABILITY = ("W0000 00:00:1700000000.000000   4242 gpu_device.cc:2344] Ignoring visible gpu "
              "device (device: 0, name: Tesla K80, pci bus id: 0000:00:04.0, compute "
              "capability: 3.7) with Cuda compute capability 3.7. The minimum required Cuda "
              "capability is 6.0.")


def test_the_ignoring_line_is_kept_first() -> None:
    lines = tflog.relevant_lines("\n".join([NOISE, CORES, NOISE, "failed call to cuInit: "
                                            "CUDA_ERROR_NO_DEVICE"]))
    assert "] Ignoring visible gpu device (device: 1" in lines[0]
    cause, fix = tflog.explain(lines)  # type: ignore[misc]
    assert cause == ("TensorFlow ignores GPU 1 (NVIDIA GeForce GT 1030): 3 multiprocessors, "
                     "it wants at least 8")
    assert "TF_MIN_GPU_MULTIPROCESSOR_COUNT=3" in fix


def test_a_capability_below_the_builds_minimum() -> None:
    cause, fix = tflog.explain(tflog.relevant_lines(CAPABILITY))  # type: ignore[misc]
    assert "compute capability 3.7, this build needs at least 6.0" in cause
    assert "GPUS=" in fix


def test_the_check_shows_tensorflows_reason(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    tf = dataclasses.replace(tf_facts(1), log=tflog.relevant_lines(CORES))
    check = check_tf_devices(machine_facts("all", tf=tf))
    assert check.status == "error"
    assert "TensorFlow says: I tensorflow/core/common_runtime/gpu/gpu_device.cc:2022] " \
        "Ignoring visible gpu device (device: 1" in check.found
    assert "cause: TensorFlow ignores GPU 1" in check.found
    assert "TF_MIN_GPU_MULTIPROCESSOR_COUNT=3" in check.fix


def test_a_library_tensorflow_missed_but_the_doctor_loaded(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(2))
    log = ("Could not load dynamic library 'libcudart.so.12'; dlerror: libcudart.so.12: "
           "cannot open shared object file: No such file or directory",)
    tf = dataclasses.replace(tf_facts(0), log=log)
    check = check_tf_devices(machine_facts("all", tf=tf))
    folder = f"{WHEELS}/cuda_runtime/lib"
    assert f"but it loads from {folder} (wheel)" in check.found
    assert f"export LD_LIBRARY_PATH={folder}" in check.fix
