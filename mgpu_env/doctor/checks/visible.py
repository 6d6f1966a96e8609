"""Which GPUs the run gets, from GPUS to what TensorFlow lists.

Which GPUs the run gets: GPUS against the machine, the visibility variables, and what
TensorFlow finally lists."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import (
    SAME_CAUSE_AS_NVML,
    TF_NOT_PROBED,
    TF_SKIPPED,
    Check,
    CheckId,
    check,
    expected_tf_gpus,
    gpu_names,
    no_gpu,
    nvml_fix,
    wants_gpus,
)
from mgpu_env.doctor.checks.driver import driver_failure
from mgpu_env.doctor.checks.libraries import library_cause, search_path_cause
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware.devices import visible_gpus
from mgpu_env.tfprobes import tflog

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
VISIBLE_REQUEST = CheckId("visible.request")
VISIBLE_ENVIRONMENT = CheckId("visible.environment")
VISIBLE_TENSORFLOW = CheckId("visible.tensorflow")


@check(230, VISIBLE_REQUEST, preflight=True)
def check_request(facts: Facts) -> Check:
    title = "GPUS request"
    count = len(facts.gpus)
    expected = (
        f"all, none, indices 0..{count - 1} or UUIDs of these GPUs" if count
        else "all or none (no GPU here)"
    )
    if facts.selection_error is not None or facts.selection is None:
        return VISIBLE_REQUEST(
            title, "error",
            f"GPUS={facts.request}: {facts.selection_error}", expected,
            "set GPUS=all, GPUS=none, or indices/UUIDs that `nvidia-smi -L` lists",
            bad_setting=True,
        )
    selection = facts.selection
    if facts.request.kind == "none":
        return VISIBLE_REQUEST(title, "ok", "GPUS=none: training uses the CPU", expected)
    if selection.uses_cpu and not facts.nvml.listing.available:
        # The driver line is the cause and already says training will use the CPU.
        return VISIBLE_REQUEST(title, "skip",
                               f"GPUS={facts.request}: no GPU, training will use the CPU"
                               + SAME_CAUSE_AS_NVML, expected, skipped_for=no_gpu(facts))
    if selection.uses_cpu:
        return VISIBLE_REQUEST(
            title, "warn",
            f"GPUS={facts.request}: no GPU, training will use the CPU", expected,
            nvml_fix(facts) if not facts.nvml.listing.available else
            "check the driver lines above; GPUS=none silences this",
        )
    found = f"GPUS={facts.request} -> {gpu_names(selection.gpus)}"
    if selection.note:
        found += f" ({selection.note})"
    return VISIBLE_REQUEST(title, "ok", found, expected)


@check(240, VISIBLE_ENVIRONMENT)
def check_visibility_env(facts: Facts) -> Check:
    title = "Visible devices"
    env = facts.environ
    shown = [
        f"{name}={env[name]!r}" if name in env else f"{name} unset"
        for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    ]
    found = ", ".join(shown)
    expected = "unset, or agreeing with GPUS (mgpu sets CUDA_DEVICE_ORDER=PCI_BUS_ID itself)"
    selection = facts.selection
    if selection is not None and selection.cuda_visible_devices is not None:
        found += f"; mgpu sets CUDA_VISIBLE_DEVICES={selection.cuda_visible_devices!r}"
    preset = env.get("CUDA_VISIBLE_DEVICES")
    if (
        facts.request.kind == "all" and preset is not None and facts.gpus
        and len(visible_gpus(preset, facts.gpus)) == 0
    ):
        return VISIBLE_ENVIRONMENT(
            title, "warn", found, expected,
            f"CUDA_VISIBLE_DEVICES={preset!r} hides every GPU although NVML sees "
            f"{len(facts.gpus)}: unset it (GPUS chooses the GPUs)")
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower()
    if nvidia in ("void", "none") and wants_gpus(facts) and not facts.gpus:
        return VISIBLE_ENVIRONMENT(
            title, "warn", found, expected,
            "NVIDIA_VISIBLE_DEVICES hides the GPUs from the container: set it to all")
    return VISIBLE_ENVIRONMENT(title, "ok", found, expected)


def _root_cause(facts: Facts) -> tuple[str, str] | None:
    """Why TensorFlow has fewer GPUs, from the probes nearest the cause: CUDA's own
    initialisation, then the library files, then TensorFlow's log."""
    api = facts.cuda_driver.value if facts.cuda_driver is not None else None
    if api is not None and api.init_code not in (None, 0):
        return driver_failure(facts, api.init_code, api.library)
    tf = facts.tensorflow
    ignored = tflog.explain(tf.log) if tf is not None and tf.log else None
    if ignored is not None and ignored[0].startswith("TensorFlow ignores GPU"):
        return ignored  # TensorFlow's own words for the GPU it left out
    return library_cause(facts) or search_path_cause(facts) or ignored


@check(250, VISIBLE_TENSORFLOW, preflight=True)
def check_tf_devices(facts: Facts) -> Check:
    title = "TensorFlow GPUs"
    tf = facts.tensorflow
    wanted = expected_tf_gpus(facts)
    expected = f"{wanted[0]} ({wanted[1]})" if wanted else "GPUS fits the machine"
    if tf is None:
        return VISIBLE_TENSORFLOW(title, "skip", TF_SKIPPED, expected,
                                  skipped_for=TF_NOT_PROBED)
    if not tf.gpus.ok or tf.gpus.value is None:
        return VISIBLE_TENSORFLOW(title, "error", tf.gpus.text(), expected,
                                  "see the TensorFlow build line above")
    names = ", ".join(tf.gpus.value) or "none"
    found = f"Num GPUs Available: {len(tf.gpus.value)} ({names})"
    if wanted is None:
        return VISIBLE_TENSORFLOW(title, "skip", found, expected)
    if len(tf.gpus.value) == wanted[0]:
        return VISIBLE_TENSORFLOW(title, "ok", found, expected)
    info = tf.build.value if tf.build.ok else None
    reason = _root_cause(facts)
    if info is not None and not info.is_cuda_build:
        fix = "TensorFlow is a CPU-only build: see the TensorFlow build line"
    elif len(tf.gpus.value) < wanted[0]:
        fix = reason[1] if reason else (
            "TensorFlow could not open every GPU: check the driver and CUDA lines above"
            + ("" if tf.log else "; TensorFlow logged no reason")
        )
    else:
        fix = "unset CUDA_VISIBLE_DEVICES and choose the GPUs with GPUS=..."
    found = (f"TensorFlow lists {len(tf.gpus.value)} GPU(s) but {wanted[1]} asks for "
             f"{wanted[0]}; " + found)
    if len(tf.gpus.value) < wanted[0]:
        if tf.log:
            found += "\nTensorFlow says: " + "\n  ".join(tf.log)
        if reason:
            found += f"\ncause: {reason[0]}"
    return VISIBLE_TENSORFLOW(title, "error", found, expected, fix)
