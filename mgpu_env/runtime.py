"""The steps every command takes before TensorFlow starts: settings, then GPU selection."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

from mgpu_env.config.settings import (
    BY_ENV,
    ResolvedSettings,
    SettingError,
    SettingsErrors,
    export_env_file_extras,
    setting_error_message,
)
from mgpu_env.hardware import nvml
from mgpu_env.hardware.devices import GpuSelection, apply_gpu_selection, select_gpus


def prepare_environment(
    resolved: ResolvedSettings, environ: MutableMapping[str, str] | None = None
) -> list[str]:
    """Export the settings file's other variables (NCCL_*, ...) and quiet TensorFlow's logs.

    The process environment wins over the file, as with docker compose's env_file. TensorFlow's
    C++ INFO and WARNING lines (oneDNN, CPU features) bury the summary, so they are hidden
    unless TF_CPP_MIN_LOG_LEVEL is set. Returns the names exported from the file.
    """
    environ = os.environ if environ is None else environ
    exported = export_env_file_extras(resolved, environ)
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return exported


@dataclass(frozen=True)
class Launch:
    """Resolved settings and the GPUs chosen for them, already applied to the environment."""

    resolved: ResolvedSettings
    selection: GpuSelection
    listing: nvml.GpuListing


def choose_gpus(
    resolved: ResolvedSettings,
    environ: MutableMapping[str, str] | None = None,
    listing: nvml.GpuListing | None = None,
) -> Launch:
    """Check GPUS against NVML and set CUDA_VISIBLE_DEVICES. Raises SettingsErrors (exit 2).

    NVML is asked only when GPUS names GPUs or asks for all of them; GPUS=none needs no
    driver at all.
    """
    environ = os.environ if environ is None else environ
    request = resolved.settings.gpus
    if listing is None:
        listing = nvml.GpuListing() if request.kind == "none" else nvml.list_gpus()
    try:
        selection = select_gpus(request, listing, environ)
    except SettingError as err:
        declaration = BY_ENV["GPUS"]
        raise SettingsErrors(
            [
                setting_error_message(
                    declaration, str(request), resolved.sources.get("GPUS", "default"), str(err)
                )
            ]
        ) from None
    apply_gpu_selection(selection, environ)
    return Launch(resolved, selection, listing)
