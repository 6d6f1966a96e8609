"""What TensorFlow will ask of the machine's limits, estimated from its CPU and GPU count.

What TensorFlow will ask of the machine's limits, from its CPU and GPU count: a documented
estimate, so each limit can be judged against this machine rather than against a constant.

The model (each term says where it comes from), checked against TensorFlow 2.21 on this
project's CI machine (2 CPUs, no GPU: MirroredStrategy on 2 logical CPUs, a tf.data map and
prefetch, `fit`), run as an unprivileged user under `prlimit`:
- Threads. TensorFlow sizes its inter-op and intra-op (Eigen) pools to the CPUs the process may
  run on (`port::MaxParallelism`, the affinity mask: a CFS quota does not shrink them);
  tf.data's private pool and XLA/LLVM's compile threads scale with them too: 4 x CPUs. Each GPU
  adds the CUDA driver's threads of its context, TensorFlow's event poller and host callbacks,
  MirroredStrategy's replica thread and NCCL's proxy threads: 8 per GPU. Python, Keras and the
  iterators' own threads (`tf_data_multi_device_iterator_resource`, ...): 40. Measured: the
  run stops at RLIMIT_NPROC 38 (`LLVM ERROR: pthread_create failed: Resource temporarily
  unavailable`, or `Check failed: ret == 0 (11 vs. 0) Thread tf_data_private_threadpool
  creation via pthread_create() failed`) and finishes at 41, though only 14 threads are left
  after `fit`: the peak is transient. The model says 48.
- Host memory. TensorFlow's import: 1 GiB (650 MiB RSS measured for the CPU build, 672 MiB
  after `fit`; the CUDA build maps cuDNN, cuBLAS and XLA's libraries too); each GPU's CUDA
  context, handles and TensorFlow's pinned host pool: 2 GiB. The data the input pipeline
  holds comes on top (not known here).
- Address space (RLIMIT_AS). TensorFlow's mapped libraries and heaps, 2 GiB (VmSize 2.7 GB
  after `fit`); every thread's stack (glibc gives each new thread RLIMIT_STACK's soft value,
  2 MiB when that is unlimited); glibc's malloc arenas, 64 MiB of address space each, up to 8
  per CPU; with a GPU, CUDA reserves address space for unified addressing at `cuInit`, about
  the host's memory and every GPU's again (with less: `CUDA_ERROR_OUT_OF_MEMORY`). Measured:
  the run stops at RLIMIT_AS 2.8 GB (a tf.data thread cannot start) and finishes at 3.3 GB;
  the model says 3.4 GiB. TensorFlow on a CPU with a 10 GB RLIMIT_AS failing to map thread
  stacks is tensorflow#37449.
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
THREADS_PER_CPU = 4  # inter-op, intra-op, tf.data, XLA/LLVM's compile threads
THREADS_PER_GPU = 8
THREADS_BASE = 40
ADDRESS_BASE = 2 * 1024**3  # TensorFlow's mapped libraries and heaps
MALLOC_ARENA = 64 * 1024**2  # glibc's HEAP_MAX_SIZE on 64-bit: address space per arena
ARENAS_PER_CPU = 8  # glibc's M_ARENA_MAX default on 64-bit: 8 x CPUs
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
        return (f"{THREADS_PER_CPU} x {self.cpus} CPU(s) + {THREADS_PER_GPU} x "
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


@dataclass(frozen=True)
class Sizing:
    """What sizes TensorFlow's demand on this machine: `cpus` CPUs and `gpus` GPUs, the
    stack's soft limit, `host_memory` and `gpu_memory` (bytes, all GPUs: they size CUDA's
    address reservation), whether NCCL_SHM_DISABLE=1, and `pools`: TF_NUM_INTEROP_THREADS and
    TF_NUM_INTRAOP_THREADS where the user set them (they replace two of the CPU-sized pools)."""

    cpus: int
    gpus: int
    stack_soft: int | None = None
    host_memory: int = 0
    gpu_memory: int = 0
    shm_disabled: bool = False
    pools: tuple[int, int] | None = None


def demand_for(sizing: Sizing) -> Demand:
    """What TensorFlow will ask for on a machine of this sizing."""
    cpus, gpus, pools = sizing.cpus, sizing.gpus, sizing.pools
    cpu_threads = (THREADS_PER_CPU * cpus if pools is None
                   else (THREADS_PER_CPU - 2) * cpus + sum(pools))
    threads = cpu_threads + THREADS_PER_GPU * gpus + THREADS_BASE
    memory = MEMORY_BASE + MEMORY_PER_GPU * gpus
    stack = thread_stack_bytes(sizing.stack_soft)
    arenas = min(threads, ARENAS_PER_CPU * cpus)
    address_space = ADDRESS_BASE + threads * stack + arenas * MALLOC_ARENA
    if gpus:
        address_space += sizing.host_memory + sizing.gpu_memory
    pairs = gpus * (gpus - 1) // 2
    shm = 0 if sizing.shm_disabled else 2 * NCCL_SHM_SEGMENT * pairs
    files = FILES_BASE + FILES_PER_GPU * gpus + FILES_PER_CPU * cpus
    return Demand(cpus, gpus, threads, memory, address_space, stack, shm, files)


def size_text(value: int | None) -> str:
    """Bytes as a person reads them; None is unlimited."""
    if value is None:
        return "unlimited"
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    return f"{value / MIB:.0f} MiB" if value >= MIB else f"{value} bytes"
