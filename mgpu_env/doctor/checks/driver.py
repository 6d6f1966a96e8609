"""The NVIDIA driver: NVML loads, its version against the build's CUDA."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import (
    Check,
    Status,
    gpu_compose_file,
    no_gpu,
    nvml_fix,
    target_build,
    wants_gpus,
)
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import compat, hostgpus


def check_nvml(facts: Facts) -> Check:
    snapshot = facts.nvml
    listing = snapshot.listing
    title = "Driver (NVML)"
    intended = gpu_compose_file(facts)
    compose = " (started with docker-compose.gpu.yml, which is for GPUs)" if intended else ""
    left_out = hostgpus.gpus_left_outside(
        facts.environ, len(listing.gpus) if listing.available else 0,
        facts.host.host_gpus.value or 0)
    if left_out and wants_gpus(facts):
        # The CPU compose file on a GPU host: an error, so `docker compose run train` stops
        # before it trains on the CPU by mistake (GPUS=none is how to mean the CPU).
        message, fix = left_out.split(" Fix: ", 1)
        return Check("driver.nvml", title, "error", message, "the host's GPUs in the container",
                     fix)
    if listing.available:
        version = snapshot.driver_version.text()
        found = (
            f"driver {version}, NVML {snapshot.nvml_version.text()}, {len(listing.gpus)} GPU(s)"
        )
        if intended and not listing.gpus:
            return Check("driver.nvml", title, "warn", found + compose,
                         "NVML loads and lists the GPUs", nvml_fix(facts))
        return Check("driver.nvml", title, "ok", found, "NVML loads")
    found = f"could not collect ({listing.error}){compose}"
    if not wants_gpus(facts):
        return Check("driver.nvml", title, "skip", found, "not needed with GPUS=none",
                     skipped_for=no_gpu(facts))
    status: Status = "warn" if facts.request.kind == "all" else "error"
    consequence = " (GPUS=all: training will use the CPU)" if status == "warn" else ""
    return Check(
        "driver.nvml", title, status, found + consequence, "NVML loads", nvml_fix(facts)
    )


def check_driver_version(facts: Facts) -> Check:
    title = "Driver version"
    row = target_build(facts)
    full, oldest = row.min_driver_linux, row.min_driver_linux_minor_compat
    expected = (
        f">= {full} for CUDA {row.cuda} (TensorFlow {row.tensorflow}); >= {oldest} runs it "
        "with minor-version compatibility on bare metal, but NVIDIA's CUDA images "
        f"(NVIDIA_REQUIRE_CUDA) start below {full.split('.')[0]} only on the data-centre "
        "driver branches they list"
    )
    if not facts.nvml.listing.available or not facts.gpus:
        found = "no GPU" if facts.nvml.listing.available else "no driver"
        return Check("driver.version", title, "skip", found, expected,
                     skipped_for=no_gpu(facts))
    driver = facts.nvml.driver_version
    if not driver.ok or not driver.value:
        return Check(
            "driver.version", title, "warn", driver.text(), expected,
            "run `nvidia-smi` to see the driver version",
        )
    fix = f"upgrade the host's NVIDIA driver to {full} or newer (a container uses the host's)"
    try:
        if compat.driver_at_least(driver.value, full):
            return Check("driver.version", title, "ok", driver.value, expected)
        if compat.driver_at_least(driver.value, oldest):
            return Check(
                "driver.version", title, "warn",
                f"{driver.value}: runs CUDA {row.cuda} only with minor-version compatibility "
                "(no PTX JIT for GPUs the build has no machine code for)",
                expected, fix,
            )
    except ValueError:
        return Check("driver.version", title, "warn", f"unreadable: {driver.value!r}", expected)
    return Check(
        "driver.version", title, "error",
        f"{driver.value}: too old for CUDA {row.cuda}", expected, fix,
    )


def check_driver_cuda(facts: Facts) -> Check:
    title = "Driver CUDA"
    row = target_build(facts)
    expected = f">= {row.cuda} (the CUDA TensorFlow {row.tensorflow} is built with)"
    if not facts.nvml.listing.available or not facts.gpus:
        found = "no GPU" if facts.nvml.listing.available else "no driver"
        return Check("driver.cuda", title, "skip", found, expected,
                     skipped_for=no_gpu(facts))
    encoded = facts.nvml.cuda_driver_version
    if not encoded.ok or encoded.value is None:
        return Check("driver.cuda", title, "warn", encoded.text(), expected,
                     "run `nvidia-smi`: its header shows 'CUDA Version'")
    supported = compat.cuda_from_nvml(encoded.value)
    have, want = compat.version_tuple(supported), compat.version_tuple(row.cuda)
    fix = (
        f"upgrade the host's NVIDIA driver to {row.min_driver_linux} or newer "
        f"(it then supports CUDA {row.cuda})"
    )
    if have >= want:
        return Check("driver.cuda", title, "ok", supported, expected)
    if have[0] == want[0]:
        # Judged once, by driver.version (a warning there); not a second warning here.
        return Check("driver.cuda", title, "ok",
                     f"{supported}: CUDA {row.cuda} runs with minor-version compatibility",
                     expected)
    return Check("driver.cuda", title, "error",
                 f"{supported}: CUDA {row.cuda} cannot run", expected, fix)
