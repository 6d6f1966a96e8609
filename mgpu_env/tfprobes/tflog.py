"""TensorFlow's own reason, from what a child that imported it wrote on stderr.

When TensorFlow lists fewer GPUs than asked, the reason is in its C++ log: `failed call to
cuInit: CUDA_ERROR_UNKNOWN: unknown error`, `Could not load dynamic library 'libcudnn.so.9';
dlerror: ...`, `Cannot dlopen some GPU libraries`. `relevant_lines` keeps the few lines that
say why (cuInit first, then the dlopen lines, then other CUDA errors), the last ones of each
kind, without the timestamp; `explain` names the cause and the fix those lines point to.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mgpu_env.hardware import cudaerrors

MAX_LINES = 5
# "2024-05-01 12:00:00.123456: E external/.../cuda_driver.cc:268] " or "E0000 00:00:17... 7665 "
_PREFIX = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: )?(?:[IWEF]\d{4} [\d:.]+\s+\d+\s+)?"
)
# What to keep, most telling first.
_KINDS: tuple[re.Pattern[str], ...] = (
    # TensorFlow's own reason for leaving a GPU out (too few multiprocessors, a compute
    # capability below its minimum): never filtered.
    re.compile(r"Ignoring visible gpu device|Ignoring (?:the )?GPU", re.I),
    re.compile(r"cuInit", re.I),
    re.compile(r"Cannot dlopen|Could not load dynamic library|dlopen|dlerror|"
               r"undefined symbol|cannot open shared object", re.I),
    re.compile(r"CUDA_ERROR|cudaError|Loaded runtime CuDNN|driver version|"
               r"forward compatibility|PTX|ptxas|libdevice|NCCL|nvJitLink", re.I),
)


def _clean(line: str) -> str:
    return _PREFIX.sub("", line.strip())


def relevant_lines(stderr: str, limit: int = MAX_LINES) -> tuple[str, ...]:
    """The lines of `stderr` that say why TensorFlow has no GPU, most telling first."""
    lines = [_clean(line) for line in stderr.splitlines() if line.strip()]
    chosen: list[str] = []
    for kind in _KINDS:
        matching = [line for line in lines if kind.search(line) and line not in chosen]
        # The last lines of a kind: the final attempt, after any retries.
        for line in list(dict.fromkeys(reversed(matching)))[::-1][-limit:]:
            if len(chosen) < limit and line not in chosen:
                chosen.append(line)
    return tuple(line[:400] for line in chosen)


def explain(lines: Iterable[str]) -> tuple[str, str] | None:
    """(cause, fix) that TensorFlow's log lines point to; None when they name none."""
    text = "\n".join(lines)
    ignored = _ignored_device(text)
    if ignored is not None:
        return ignored
    code = cudaerrors.code_in(text)
    if code is not None and code != 0:
        known = cudaerrors.describe(code)
        return known.cause, known.fix
    match = re.search(r"undefined symbol: (\S+)", text)
    if match:
        return (
            f"a CUDA library loaded from another folder than its partner: `{match.group(1)}` "
            "is missing from the copy the loader found first (an old CUDA folder on "
            "LD_LIBRARY_PATH is the usual cause)",
            "remove the folder of the older copy from LD_LIBRARY_PATH (see the Libraries "
            "TensorFlow loaded line), then rerun `mgpu doctor`",
        )
    match = re.search(r"Could not load dynamic library '([^']+)'", text)
    if match:
        return (
            f"TensorFlow could not load {match.group(1)}",
            "install the CUDA libraries TensorFlow was built with: `make venv CUDA=1` or "
            "the image; see the CUDA libraries line",
        )
    if "Loaded runtime CuDNN library" in text:
        return ("TensorFlow loaded an older cuDNN than it was built with",
                "see the cuDNN loaded and Libraries TensorFlow loaded lines")
    return None


_CORES = re.compile(r"Ignoring visible gpu device \(device: (\d+), name: ([^,]+),.*?\) with "
                    r"core count: (\d+)\. The minimum required count is (\d+)", re.I)
_CAPABILITY = re.compile(r"Ignoring visible gpu device \(device: (\d+), name: ([^,]+),.*?\) "
                         r"with (?:Cuda )?compute capability (\S+?)\.? The minimum required "
                         r"(?:Cuda )?capability is (\S+?)\.?$", re.I | re.M)


def _ignored_device(text: str) -> tuple[str, str] | None:
    """TensorFlow's "Ignoring visible gpu device" line: its reason, in its words."""
    match = _CORES.search(text)
    if match:
        device, name, cores, minimum = match.groups()
        return (f"TensorFlow ignores GPU {device} ({name}): {cores} multiprocessors, it wants "
                f"at least {minimum}",
                f"set TF_MIN_GPU_MULTIPROCESSOR_COUNT={cores} to let TensorFlow use it (a small "
                "GPU, slower than the others), or leave it out with GPUS=")
    match = _CAPABILITY.search(text)
    if match:
        device, name, have, want = match.groups()
        return (f"TensorFlow ignores GPU {device} ({name}): compute capability {have}, this "
                f"build needs at least {want}",
                "leave it out with GPUS=, or use a TensorFlow built for this GPU")
    return None
