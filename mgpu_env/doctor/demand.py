"""What TensorFlow will ask of the machine's limits, from its CPU and GPU count: a documented
estimate, so each limit can be judged against this machine rather than against a constant.

The model (each term says where it comes from):
- Threads. TensorFlow sizes its inter-op and intra-op (Eigen) pools to the CPUs the process may
  run on (`port::MaxParallelism`, the affinity mask: a CFS quota does not shrink them), and
  tf.data's parallel map and prefetch run on a pool of the same size: 3 x CPUs. Each GPU adds
  the CUDA driver's threads of its context, TensorFlow's event poller and host callbacks,
  MirroredStrategy's replica thread and NCCL's proxy threads: 8 per GPU. Python, the Keras loop
  and TensorFlow's background work: 16. Measured: 14 threads after `fit` with MirroredStrategy
  on 2 logical CPUs (2 CPUs, no GPU), where the model says 22.
- Host memory. TensorFlow's import: 1 GiB (650 MiB RSS measured for the CPU build; the CUDA
  build maps cuDNN, cuBLAS and XLA's libraries too); each GPU's CUDA context, handles and
  TensorFlow's pinned host pool: 2 GiB. The data the input pipeline holds comes on top (not
  known here).
- Address space (RLIMIT_AS). The host memory above, plus every thread's stack (glibc gives each
  new thread RLIMIT_STACK's soft value, 2 MiB when that is unlimited): TensorFlow on a CPU with
  a 10 GB RLIMIT_AS fails mapping thread stacks (tensorflow#37449). With a GPU, CUDA reserves
  address space for unified addressing at `cuInit`, about the host's memory and every GPU's
  again: with less, `cuInit` or the first allocation fails with CUDA_ERROR_OUT_OF_MEMORY.
- /dev/shm. NCCL's shared-memory transport (used between GPUs without P2P, and by its proxy)
  creates one segment per direction per GPU pair; its own error names the size, 9637888 bytes
  (`Error while creating shared memory segment /dev/shm/nccl-XXXX (size 9637888)`,
  NVIDIA/nccl#1518): 2 x 9637888 per pair. None with NCCL_SHM_DISABLE=1, or one GPU.
- Open files. 64 for Python and TensorFlow, about 32 per GPU (CUDA opens /dev/nvidia* several
  times per context; NCCL's sockets), and tf.data's interleave reads about a file per CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
GIB = 1024 * MIB
THREADS_PER_CPU = 3  # inter-op, intra-op, tf.data
THREADS_PER_GPU = 8
THREADS_BASE = 16
MEMORY_BASE = 1 * GIB
MEMORY_PER_GPU = 2 * GIB
GLIBC_DEFAULT_STACK = 2 * MIB  # x86_64 glibc's thread stack when RLIMIT_STACK is unlimited
NCCL_SHM_SEGMENT = 9637888  # the size NCCL's own "Error while creating shared memory segment"
FILES_BASE = 64
FILES_PER_GPU = 32
FILES_PER_CPU = 1
NVIDIA_STACK = 64 * MIB  # NVIDIA's containers: --ulimit stack=67108864


@dataclass(frozen=True)
class Demand:
    """What TensorFlow will ask for on this machine; `why` says how each number was made."""

    cpus: int
    gpus: int
    threads: int
    memory: int  # host bytes (without the data)
    address_space: int
    thread_stack: int  # bytes of address space each thread's stack takes
    shm: int
    open_files: int

    def why_threads(self) -> str:
        return (f"{THREADS_PER_CPU} pools x {self.cpus} CPU(s) + {THREADS_PER_GPU} x "
                f"{self.gpus} GPU(s) + {THREADS_BASE}")

    def why_memory(self) -> str:
        return (f"TensorFlow {MEMORY_BASE // GIB} GiB + {MEMORY_PER_GPU // GIB} GiB x "
                f"{self.gpus} GPU(s), before the data")

    def why_shm(self) -> str:
        pairs = self.gpus * (self.gpus - 1) // 2
        return f"NCCL: 2 x {NCCL_SHM_SEGMENT} bytes x {pairs} GPU pair(s)"


def thread_stack_bytes(stack_soft: int | None) -> int:
    """The address space glibc maps for each new thread's stack."""
    return GLIBC_DEFAULT_STACK if stack_soft is None else max(stack_soft, 16 * 1024)


def estimate(
    cpus: int, gpus: int, *, stack_soft: int | None = None, host_memory: int = 0,
    gpu_memory: int = 0, shm_disabled: bool = False, pools: tuple[int, int] | None = None,
) -> Demand:
    """The demand for `cpus` CPUs and `gpus` GPUs. `pools`: TF_NUM_INTEROP_THREADS and
    TF_NUM_INTRAOP_THREADS where the user set them (they replace two of the CPU-sized pools);
    `host_memory` and `gpu_memory` (bytes, all GPUs) size CUDA's address reservation."""
    cpu_threads = THREADS_PER_CPU * cpus if pools is None else cpus + sum(pools)
    threads = cpu_threads + THREADS_PER_GPU * gpus + THREADS_BASE
    memory = MEMORY_BASE + MEMORY_PER_GPU * gpus
    stack = thread_stack_bytes(stack_soft)
    address_space = memory + threads * stack
    if gpus:
        address_space += host_memory + gpu_memory
    pairs = gpus * (gpus - 1) // 2
    shm = 0 if shm_disabled else 2 * NCCL_SHM_SEGMENT * pairs
    files = FILES_BASE + FILES_PER_GPU * gpus + FILES_PER_CPU * cpus
    return Demand(cpus, gpus, threads, memory, address_space, stack, shm, files)


def size_text(value: int | None) -> str:
    """Bytes as a person reads them; None is unlimited."""
    if value is None:
        return "unlimited"
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    return f"{value / MIB:.0f} MiB" if value >= MIB else f"{value} bytes"
