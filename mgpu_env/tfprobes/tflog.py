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

# TensorFlow's start-up lines that every healthy start prints: never a reason a GPU is
# missing, so never kept, and never offered as a cause (issue 41). Each with why it is noise.
NOISE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Unable to register (?:cuDNN|cuFFT|cuBLAS) factory|Attempting to register "
                r"factory for plugin", re.I),
     "XLA and TensorFlow both register the same CUDA plugin factory; the second is refused"),
    (re.compile(r"could not open file to read NUMA node|NUMA node.*-1|"
                r"had negative value \(-1\)|Your kernel may have been built without NUMA", re.I),
     "the GPU's numa_node in sysfs is -1 (one socket, or a VM): TensorFlow assumes node 0"),
    (re.compile(r"This TensorFlow binary is optimized to use available CPU instructions|"
                r"rebuild TensorFlow with the appropriate compiler flags|"
                r"Your CPU supports instructions that this TensorFlow binary was not", re.I),
     "a notice that a build for this CPU could be faster; it runs as it is"),
    (re.compile(r"oneDNN custom operations are on|TF_ENABLE_ONEDNN_OPTS", re.I),
     "oneDNN's notice about floating-point round-off order"),
    (re.compile(r"TF-TRT Warning|Could not find TensorRT|libnvinfer", re.I),
     "TensorRT is optional; training does not use it"),
    (re.compile(r"computation placer already registered|absl::InitializeLog\(\) is called "
                r"are written to STDERR|All log messages before absl", re.I),
     "XLA's and absl's start-up bookkeeping"),
)


def is_noise(line: str) -> bool:
    """Whether `line` is one of TensorFlow's harmless start-up lines."""
    return any(pattern.search(line) for pattern, _ in NOISE)


def _clean(line: str) -> str:
    return _PREFIX.sub("", line.strip())


def relevant_lines(stderr: str, limit: int = MAX_LINES) -> tuple[str, ...]:
    """The lines of `stderr` that say why TensorFlow has no GPU, most telling first."""
    lines = [_clean(line) for line in stderr.splitlines() if line.strip() and not is_noise(line)]
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
    text = "\n".join(line for line in lines if not is_noise(line))
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
