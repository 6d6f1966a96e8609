"""docs/troubleshooting.md, written from the catalogue of real failures:
`python -m tests.catalogue.docs > docs/troubleshooting.md`. A test checks that the page is
exactly what this writes, and the catalogue test that the doctor prints what it says."""

from __future__ import annotations

from tests.catalogue.threads import THREADS, Thread

# The title each check has in the table (tests/processes/test_doctor_catalogue.py checks them).
CHECK_TITLES = {
    "driver.nvml": "Driver (NVML)",
    "driver.version": "Driver version",
    "driver.cuda_init": "CUDA (cuInit)",
    "gpu.0": "GPU 0",
    "gpu.mixed_precision": "Mixed precision",
    "cuda.libdevice": "libdevice (XLA)",
    "cuda.libraries": "CUDA libraries",
    "cuda.loaded": "TF's CUDA libraries",
    "tensorflow.cudnn": "cuDNN loaded",
    "host.docker": "Docker GPUs",
    "host.p2p": "P2P path",
    "container.shm": "/dev/shm size",
    "nccl.variables.NCCL_SOCKET_IFNAME": "NCCL variables",
    "visible.tensorflow": "TensorFlow GPUs",
}

INTRO = """\
# Troubleshooting: what `mgpu doctor` says, and the fix that worked

Each section below is a failure users reported in a public bug thread while setting up
multi-GPU TensorFlow, what `mgpu doctor` prints for it, and the fix the thread converged on.
The page is written from the doctor's catalogue of real failures
(`tests/catalogue/threads.py`): every thread there is simulated in the test suite (fake NVML
answers, fake NVIDIA libraries built with gcc with the real sonames, the real dynamic loader,
a stand-in `tensorflow` only where the real one cannot show the fault) and the test checks
that the doctor flags it, names the cause and prints this fix, word for word. Regenerate the
page with `python -m tests.catalogue.docs > docs/troubleshooting.md`.

Run `mgpu doctor` (add `--no-tf` for the fast NVML and host part, `--smoke` for a real
all-reduce, `--report` for a bug report). Each fix below is printed under the table as
`[n] ...`, and is in `mgpu doctor --json` as the check's `fix`. Paths in the fixes are the
ones of your machine; here they are examples.

"""

BLACKWELL = """\
## Blackwell GPUs and the image

TensorFlow 2.21's pip wheel has machine code for compute capabilities 6.0 to 9.0 and PTX for
9.0. On Blackwell GPUs (10.x: B200; 12.x: RTX 50xx, RTX PRO Blackwell) its kernels fail to
load (`CUDA_ERROR_INVALID_PTX`, then `CUDA_ERROR_INVALID_HANDLE`: tensorflow#97387, #99592,
#89272, #101746), and XLA emits PTX 8.5, which cannot target sm_120 (tensorflow#111958).
A newer `ptxas` in the image would not help: the failing kernels are TensorFlow's own, not
XLA's. So the image carries the `ptxas` of TensorFlow's CUDA (12.5) and nothing for
Blackwell, and `mgpu doctor` reports a Blackwell GPU as an error with the one fix users
found to work: NVIDIA's NGC TensorFlow container, built with CUDA 12.8 or later.

"""


def _fix(thread: Thread) -> str:
    return thread.fix.replace("{tmp}", "").replace("{site}", "<site-packages>")


def _printed(thread: Thread) -> str:
    label = thread.status.upper()
    return (f"`{label}` on the **{CHECK_TITLES[thread.check]}** line, naming "
            + ", ".join(f"“{word}”" for word in thread.cause))


def sections() -> list[tuple[str, list[Thread]]]:
    """The threads under their headings, in catalogue order."""
    grouped: list[tuple[str, list[Thread]]] = []
    for thread in THREADS:
        if thread.title or not grouped:
            grouped.append((thread.title or thread.symptom, [thread]))
        else:
            grouped[-1][1].append(thread)
    return grouped


def render() -> str:
    lines = [INTRO.rstrip("\n"), "", "## Contents", ""]
    for title, _threads in sections():
        lines.append(f"- {title}")
    lines.append("- Blackwell GPUs and the image")
    lines.append("")
    for title, threads in sections():
        lines += [f"## {title}", ""]
        for thread in threads:
            lines += [
                f"**[{thread.id}]({thread.url})**: {thread.symptom}.",
                "",
                f"- What `mgpu doctor` prints: {_printed(thread)}.",
                f"- Fix: {_fix(thread)}",
                f"- Simulated in the tests: {thread.simulated}.",
                "",
            ]
    lines.append(BLACKWELL.rstrip("\n"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
