"""The NVIDIA driver: NVML loads, its version against the build's CUDA."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import (
    FIX_DRIVER_IN_CONTAINER,
    Check,
    CheckId,
    Status,
    check,
    expected_tf_gpus,
    gpu_compose_file,
    no_gpu,
    nvml_fix,
    target_build,
    wants_gpus,
)
from mgpu_env.doctor.checks.containerview import FIX_COMPUTE
from mgpu_env.doctor.checks.nvmlcause import (
    failed_devices,
    gpus_on_machine,
    nvml_failure,
    permission_cause,
)
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import compat, cudaerrors, hostgpus
from mgpu_env.hardware.cudadriver import DriverApi

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
DRIVER_NVML = CheckId("driver.nvml")
DRIVER_VERSION = CheckId("driver.version")
DRIVER_CUDA = CheckId("driver.cuda")
DRIVER_CUDA_INIT = CheckId("driver.cuda_init")

FIX_NVML_LOST = (
    "recreate the container (`docker compose up -d --force-recreate`, or stop and start it); "
    "to keep it from recurring, on the host: `sudo nvidia-ctk system create-dev-char-symlinks "
    "--create-all` (or Docker's `\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"]`), as "
    "NVIDIA/nvidia-container-toolkit#48 describes"
)


@check(10, DRIVER_NVML, preflight=True)
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
        return DRIVER_NVML(title, "error", message, "the host's GPUs in the container",
                           fix)
    if listing.available:
        version = snapshot.driver_version.text()
        found = (
            f"driver {version}, NVML {snapshot.nvml_version.text()}, {len(listing.gpus)} GPU(s)"
        )
        if listing.failed and wants_gpus(facts):
            return _failed_devices(facts, found)
        if intended and not listing.gpus:
            return DRIVER_NVML(title, "warn", found + compose,
                               "NVML loads and lists the GPUs", nvml_fix(facts))
        machine = gpus_on_machine(facts)
        if not listing.gpus and machine and wants_gpus(facts):
            # NVML starts and lists none of the machine's GPUs: never "ok, 0 GPU(s)".
            return DRIVER_NVML(title, "error",
                               f"{found}, but the kernel shows {len(machine)} NVIDIA GPU(s) "
                               f"({', '.join(machine[:8])}): none reaches NVML",
                               "NVML lists the machine's GPUs",
                               "the GPU chain's `GPUs lost at ...` lines name where each one drops "
                               "and why")
        return DRIVER_NVML(title, "ok", found, "NVML loads")
    found = f"could not collect ({listing.error}){compose}"
    if not wants_gpus(facts):
        return DRIVER_NVML(title, "skip", found, "not needed with GPUS=none",
                           skipped_for=no_gpu(facts))
    return _nvml_failed(facts, found)


def _failed_devices(facts: Facts, found: str) -> Check:
    """GPUs NVML counts but cannot use: an error when GPUS asks for them all, a warning when
    GPUS already keeps to the healthy ones."""
    failing, fix = failed_devices(facts)
    status: Status = "error" if facts.request.kind == "all" else "warn"
    return DRIVER_NVML("Driver (NVML)", status, f"{found}; {failing}",
                       "every GPU answers NVML", fix)


def _nvml_failed(facts: Facts, found: str) -> Check:
    """NVML cannot start or list the GPUs: on a machine with NVIDIA GPUs an error with the
    cause the facts point to (never a silent "CPU only"); on a machine without, a warning."""
    listing = facts.nvml.listing
    title = "Driver (NVML)"
    gpus = gpus_on_machine(facts)
    explained = nvml_failure(facts)
    fix = explained.fix
    files = facts.host.device_files.value or ()
    if (listing.error_code in (999, None) and "Unknown Error" in (listing.error or "")
            and facts.host.in_container.value and "nvidiactl" in files):
        # The container had its GPUs and lost them: systemd rewrote its cgroup's device
        # rules (NVIDIA/nvidia-container-toolkit#48).
        found += " (the container had the GPUs: it lost them, typically after `systemctl " \
                 "daemon-reload` on the host)"
        fix = FIX_NVML_LOST
    elif explained.cause and (gpus or explained.fix != nvml_fix(facts)):
        # (A machine without any NVIDIA GPU and the usual fix: the finding says enough.)
        found += f"\ncause: {explained.cause}"
    if gpus:
        shown = ", ".join(gpus[:8]) + (", ..." if len(gpus) > 8 else "")
        found += (f"\n{len(gpus)} NVIDIA GPU(s) on this machine ({shown}) and none usable: "
                  "not a CPU machine (GPUS=none trains on the CPU on purpose)")
        return DRIVER_NVML(title, "error", found, "NVML loads", fix)
    status: Status = "warn" if facts.request.kind == "all" else "error"
    consequence = " (GPUS=all: training will use the CPU)" if status == "warn" else ""
    return DRIVER_NVML(title, status, found + consequence, "NVML loads", fix)


@check(20, DRIVER_VERSION, preflight=True)
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
        return DRIVER_VERSION(title, "skip", found, expected,
                              skipped_for=no_gpu(facts))
    driver = facts.nvml.driver_version
    if not driver.ok or not driver.value:
        return DRIVER_VERSION(
            title, "warn", driver.text(), expected,
            "run `nvidia-smi` to see the driver version",
        )
    fix = f"upgrade the host's NVIDIA driver to {full} or newer (a container uses the host's)"
    try:
        if compat.driver_at_least(driver.value, full):
            return DRIVER_VERSION(title, "ok", driver.value, expected)
        if compat.driver_at_least(driver.value, oldest):
            return DRIVER_VERSION(
                title, "warn",
                f"{driver.value}: runs CUDA {row.cuda} only with minor-version compatibility "
                "(no PTX JIT for GPUs the build has no machine code for)",
                expected, fix,
            )
    except ValueError:
        return DRIVER_VERSION(title, "warn", f"unreadable: {driver.value!r}", expected)
    return DRIVER_VERSION(
        title, "error",
        f"{driver.value}: too old for CUDA {row.cuda}", expected, fix,
    )


@check(30, DRIVER_CUDA, preflight=True)
def check_driver_cuda(facts: Facts) -> Check:
    title = "Driver CUDA"
    row = target_build(facts)
    expected = f">= {row.cuda} (the CUDA TensorFlow {row.tensorflow} is built with)"
    if not facts.nvml.listing.available or not facts.gpus:
        found = "no GPU" if facts.nvml.listing.available else "no driver"
        return DRIVER_CUDA(title, "skip", found, expected,
                           skipped_for=no_gpu(facts))
    encoded = facts.nvml.cuda_driver_version
    if not encoded.ok or encoded.value is None:
        return DRIVER_CUDA(title, "warn", encoded.text(), expected,
                           "run `nvidia-smi`: its header shows 'CUDA Version'")
    supported = compat.cuda_from_nvml(encoded.value)
    have, want = compat.version_tuple(supported), compat.version_tuple(row.cuda)
    fix = (
        f"upgrade the host's NVIDIA driver to {row.min_driver_linux} or newer "
        f"(it then supports CUDA {row.cuda})"
    )
    if have >= want:
        return DRIVER_CUDA(title, "ok", supported, expected)
    if have[0] == want[0]:
        # Judged once, by driver.version (a warning there); not a second warning here.
        return DRIVER_CUDA(title, "ok",
                           f"{supported}: CUDA {row.cuda} runs with minor-version compatibility",
                           expected)
    return DRIVER_CUDA(title, "error",
                       f"{supported}: CUDA {row.cuda} cannot run", expected, fix)


# ------------------------------------------------------------- CUDA's own initialisation


def _uvm_text(facts: Facts) -> str:
    """What the host says about the unified-memory module and its device file."""
    parts = []
    modules = facts.host.nvidia_modules
    if modules.ok and modules.value is not None:
        parts.append("nvidia_uvm loaded" if "nvidia_uvm" in modules.value
                     else "nvidia_uvm NOT loaded")
    files = facts.host.device_files
    if files.ok and files.value is not None:
        parts.append("/dev/nvidia-uvm present" if "nvidia-uvm" in files.value
                     else "no /dev/nvidia-uvm")
    return ", ".join(parts)


def _uvm_missing_in_container(facts: Facts) -> bool:
    files = facts.host.device_files
    return bool(facts.host.in_container.value and files.ok and files.value is not None
                and "nvidia-uvm" not in files.value and not facts.host.wsl_gpu.value)


def _libcuda_against_module(facts: Facts, path: str) -> str | None:
    """The kernel module's version against the libcuda.so.<version> that loaded, when they
    differ (the driver's files carry its version in their name)."""
    kernel = facts.host.nvidia.kernel_driver.value
    name = path.rsplit("/", 1)[-1]
    library = name.removeprefix("libcuda.so.") if name.startswith("libcuda.so.") else ""
    if not kernel or not library[:1].isdigit() or library == kernel or "compat" in path:
        return None
    return f"the kernel module is {kernel}, {path} is {library}"


def driver_failure(facts: Facts, code: int, library: str | None) -> tuple[str, str]:
    """(cause, fix) for cuInit's `code` here: the generic cause, refined by the host facts
    (no /dev/nvidia-uvm in a container, a libcuda.so.1 from a compat or stubs folder)."""
    known = cudaerrors.describe(code)
    cause, fix = known.cause, known.fix
    path = library or ""
    blocked = permission_cause(facts.host.nvidia)
    if code in (100, 304, 999) and blocked is not None:
        # No permission on /dev/nvidia*: CUDA sees no device it may open.
        cause, fix = f"{known.cause}: {blocked.cause}", blocked.fix
    elif code in (999, 303, 304):
        uvm = _uvm_text(facts)
        if _uvm_missing_in_container(facts):
            cause, fix = ("the container has no /dev/nvidia-uvm, which CUDA needs",
                          cudaerrors.FIX_UVM_CONTAINER)
        elif uvm:
            cause += f" ({uvm})"
    elif code == 803 and (versions := _libcuda_against_module(facts, path)):
        cause = f"{known.cause}: {versions}"
    elif code in (803, 804) and "compat" in path.split("/"):
        cause = (f"{known.cause}: {library} is a forward-compatibility library "
                 "(a `compat` folder on LD_LIBRARY_PATH)")
        fix = cudaerrors.FIX_COMPAT
    elif code == 34 or "stubs" in path.split("/"):
        cause, fix = cudaerrors.describe(34).cause + f" ({library})", cudaerrors.FIX_STUB
    return cause, fix


def _summary(api: DriverApi | None) -> str:
    if api is None or (api.library is None and api.init_code is None):
        return "libcuda.so.1 does not load"
    if api.init_code:
        return f"cuInit(0) = {api.init_code} {cudaerrors.name(api.init_code)}"
    return "cuInit ok"


@check(40, DRIVER_CUDA_INIT)
def check_cuda_driver(facts: Facts) -> Check:
    """cuInit in a process with the run's environment: which libcuda.so.1, its result code,
    and as many GPUs as NVML (and GPUS) say."""
    title = "CUDA (cuInit)"
    expected = "libcuda.so.1 of the driver loads, cuInit(0) = CUDA_SUCCESS, every GPU asked for"
    probed = facts.cuda_driver
    if probed is None:
        return DRIVER_CUDA_INIT(title, "skip", "not probed",
                                expected, skipped_for=no_gpu(facts))
    api = probed.value
    if not facts.gpus and not facts.nvml.listing.failed and not gpus_on_machine(facts) and not (
            api is not None and api.initialised and api.device_count):
        # A machine with no NVIDIA GPU: CUDA has nothing to find, which is no fault.
        said = probed.text() if not probed.ok else _summary(api)
        return DRIVER_CUDA_INIT(title, "skip",
                                f"{said} (no NVIDIA GPU on this machine)", expected,
                                skipped_for=no_gpu(facts))
    if not probed.ok or probed.value is None:
        return DRIVER_CUDA_INIT(
            title, "warn", probed.text(), expected,
            "run `nvidia-smi` and `dmesg | grep -i nvrm` to see what the driver says")
    api = probed.value
    if api.library is None and api.init_code is None:
        found = f"libcuda.so.1 does not load: {api.load_error}"
        fix = (FIX_DRIVER_IN_CONTAINER if facts.host.in_container.value else
               "reinstall the NVIDIA driver (it ships libcuda.so.1); `ldconfig -p | grep "
               "libcuda` shows what the loader knows")
        if facts.host.in_container.value and facts.gpus:
            # NVML answers, so the toolkit gave the GPUs and its `utility` libraries, but
            # not `compute`'s libcuda.so.1.
            caps = facts.environ.get("NVIDIA_DRIVER_CAPABILITIES", "unset")
            found += (f"\ncause: NVML works in this container but the toolkit mounted no "
                      f"libcuda.so.1 (NVIDIA_DRIVER_CAPABILITIES={caps})")
            fix = FIX_COMPUTE
        return DRIVER_CUDA_INIT(title, "error", found, expected, fix)
    where = api.library or "libcuda.so.1 (file not found in /proc/self/maps)"
    version = f"CUDA {api.cuda_version}" if api.cuda_version else "version unknown"
    if api.init_code is None:
        return DRIVER_CUDA_INIT(title, "error", f"{where}: {api.load_error}",
                                expected, cudaerrors.FIX_STUB if "stubs" in where else
                                "reinstall the NVIDIA driver")
    if api.init_code != 0:
        cause, fix = driver_failure(facts, api.init_code, api.library)
        found = (f"cuInit(0) = {api.init_code} {cudaerrors.name(api.init_code)} ({where}, "
                 f"{version})\ncause: {cause}")
        return DRIVER_CUDA_INIT(title, "error", found, expected, fix)
    found = f"cuInit ok, {api.device_count} GPU(s) ({where}, {version})"
    wanted = expected_tf_gpus(facts)
    if api.device_count is not None and wanted is not None and api.device_count < wanted[0]:
        return DRIVER_CUDA_INIT(
            title, "error",
            found + f"; {wanted[1]} asks for {wanted[0]} (NVML lists {len(facts.gpus)})",
            expected, "CUDA sees fewer GPUs than NVML: unset CUDA_VISIBLE_DEVICES (GPUS "
            "chooses the GPUs); `nvidia-smi -q -d COMPUTE` shows GPUs in a mode CUDA skips")
    return DRIVER_CUDA_INIT(title, "ok", found, expected)
