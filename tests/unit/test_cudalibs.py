"""The CUDA user-space probe: where it looks (TensorFlow's and XLA's order), what it loads,
and the versions it decodes. Fake loaders and fake tools; no GPU, no CUDA wheels needed."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.hardware import cudalibs, cudatools
from mgpu_env.hardware.cudalibs import spec

# The real child, kept before conftest's canned stack replaces it.
REAL_COLLECT = cudalibs.collect


class FakeHandle:
    """A loaded library that answers the version calls like cuDNN and NCCL do."""

    def __init__(self, cudnn: int = 90300, nccl: int = 22707) -> None:
        self.cudnnGetVersion = lambda: cudnn
        self._nccl = nccl

    def ncclGetVersion(self, pointer: Any) -> int:
        ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int))[0] = self._nccl
        return 0


@pytest.mark.parametrize(
    ("encoded", "text"), [(22707, "2.27.7"), (21905, "2.19.5"), (2708, "2.7.8")]
)
def test_decode_nccl_version(encoded: int, text: str) -> None:
    assert cudalibs.decode_nccl_version(encoded) == text


def test_candidates_in_the_loaders_order(tmp_path: Path) -> None:
    ld = tmp_path / "ld"
    ld.mkdir()
    (ld / "libcudnn.so.9").touch()
    wheel = tmp_path / "nvidia" / "cudnn" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcudnn.so.9").touch()
    found = cudalibs.library_candidates(
        spec("cudnn"), {"LD_LIBRARY_PATH": f"/nowhere:{ld}"}, tmp_path / "nvidia"
    )
    assert found == [
        (str(ld / "libcudnn.so.9"), "LD_LIBRARY_PATH"),
        (str(wheel / "libcudnn.so.9"), "wheel"),
        ("libcudnn.so.9", "system"),
    ]


def test_wheel_library_loads_with_its_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wheel = tmp_path / "nvidia" / "cudnn" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcudnn.so.9").touch()
    loaded: list[str] = []

    def load(path: str) -> FakeHandle:
        loaded.append(path)
        return FakeHandle(cudnn=90300)

    monkeypatch.setattr(cudalibs, "load_library", load)
    monkeypatch.setattr(cudalibs, "mapped_libraries", lambda prefix: [])
    result = cudalibs.probe_library(spec("cudnn"), {}, tmp_path / "nvidia")
    assert result.ok and result.value is not None
    assert result.value.source == "wheel"
    assert result.value.version == "9.3.0"
    assert loaded == [str(wheel / "libcudnn.so.9")]


def test_missing_library_says_where_it_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def load(path: str) -> None:
        raise OSError(f"{path}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cudalibs, "load_library", load)
    monkeypatch.setattr(cudalibs, "mapped_libraries", lambda prefix: [])
    result = cudalibs.probe_library(spec("nccl"), {}, tmp_path / "nvidia")
    assert not result.ok
    assert "libnccl.so.2 is not in LD_LIBRARY_PATH" in (result.error or "")
    assert str(tmp_path / "nvidia" / "nccl" / "lib") in (result.error or "")


def test_a_file_that_does_not_load_is_named_with_the_loaders_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wheel = tmp_path / "nvidia" / "cusolver" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcusolver.so.11").touch()

    def load(path: str) -> None:
        raise OSError(f"{path}: libnvJitLink.so.12: cannot open shared object file")

    monkeypatch.setattr(cudalibs, "load_library", load)
    monkeypatch.setattr(cudalibs, "mapped_libraries", lambda prefix: [])
    result = cudalibs.probe_library(spec("cusolver"), {}, tmp_path / "nvidia")
    assert "libcusolver.so.11 does not load" in (result.error or "")
    assert "libnvJitLink.so.12" in (result.error or "")


def test_nccl_loadable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudalibs, "mapped_libraries", lambda prefix: [])
    monkeypatch.setattr(cudalibs, "load_library", lambda path: FakeHandle(nccl=22707))
    assert cudalibs.nccl_loadable({})

    def missing(path: str) -> None:
        raise OSError("cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cudalibs, "load_library", missing)
    assert not cudalibs.nccl_loadable({})


def test_real_libraries_of_this_machine_never_raise() -> None:
    for library in cudalibs.LIBRARIES:
        result = cudalibs.probe_library(library, {})
        assert result.ok or library.soname in (result.error or "")


# ------------------------------------------------------------------------- ptxas, libdevice


def fake_ptxas(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "ptxas"
    tool.write_text(
        "#!/bin/sh\necho 'ptxas: NVIDIA (R) Ptx optimizing assembler'\n"
        f"echo 'Cuda compilation tools, release {version.rsplit('.', 1)[0]}, V{version}'\n"
    )
    tool.chmod(0o755)
    return tool


def test_ptxas_in_xlas_order(tmp_path: Path) -> None:
    tf_dir = tmp_path / "site-packages" / "tensorflow"
    wheel = fake_ptxas(tmp_path / "site-packages" / "nvidia" / "cuda_nvcc" / "bin", "12.5.82")
    flags = fake_ptxas(tmp_path / "toolkit" / "bin", "12.6.20")
    on_path = fake_ptxas(tmp_path / "path", "12.4.99")
    environ = {"PATH": str(on_path.parent)}
    # PATH comes before the CUDA roots (PreferPtxasFromPath), the wheel is a CUDA root.
    assert cudalibs.find_ptxas(environ, tf_dir).path == str(on_path)
    assert cudalibs.find_ptxas({"PATH": ""}, tf_dir) == cudalibs.CudaTool(str(wheel), "12.5.82")
    # --xla_gpu_cuda_data_dir comes first of all.
    environ["XLA_FLAGS"] = f"--xla_gpu_cuda_data_dir={flags.parent.parent}"
    assert cudalibs.find_ptxas(environ, tf_dir).version == "12.6.20"


def test_ptxas_xla_refuses_is_skipped(tmp_path: Path) -> None:
    tf_dir = tmp_path / "site-packages" / "tensorflow"
    buggy = fake_ptxas(tmp_path / "buggy", "12.3.103")
    with pytest.raises(RuntimeError) as raised:
        cudalibs.find_ptxas({"PATH": str(buggy.parent)}, tf_dir)
    message = str(raised.value)
    assert "12.3.103, which XLA does not use" in message
    assert str(tmp_path / "site-packages" / "nvidia" / "cuda_nvcc" / "bin") in message


def test_libdevice_where_xla_looks(tmp_path: Path) -> None:
    tf_dir = tmp_path / "site-packages" / "tensorflow"
    folder = tmp_path / "site-packages" / "nvidia" / "cuda_nvcc" / "nvvm" / "libdevice"
    with pytest.raises(RuntimeError, match="no nvvm/libdevice folder"):
        cudalibs.find_libdevice({}, tf_dir)
    folder.mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"has no libdevice\.10\.bc"):
        cudalibs.find_libdevice({}, tf_dir)
    (folder / "libdevice.10.bc").touch()
    assert cudalibs.find_libdevice({}, tf_dir) == str(folder / "libdevice.10.bc")


def test_xla_flags_folder_is_the_first_root(tmp_path: Path) -> None:
    roots = cudatools.cuda_roots(
        {"XLA_FLAGS": "--xla_gpu_autotune_level=0 --xla_gpu_cuda_data_dir=/opt/cuda-12.5"},
        tmp_path / "lib" / "python3.12" / "site-packages" / "tensorflow",
    )
    assert roots[0] == Path("/opt/cuda-12.5")
    assert Path("/usr/local/cuda") in roots
    assert roots.index(Path("/usr/local/cuda")) < roots.index(
        tmp_path / "lib" / "python3.12" / "site-packages" / "nvidia" / "cuda_nvcc"
    )


# ---------------------------------------------------------------------------- the child


def test_json_round_trip() -> None:
    from tests.support.fake_doctor import cuda_stack

    for stack in (cuda_stack(), cuda_stack(missing=("nccl",), ptxas=None, libdevice=False),
                  cudalibs.failed("boom")):
        assert cudalibs.from_json(cudalibs.to_json(stack)) == stack


def test_real_child_on_this_machine() -> None:
    """The real probe in a child: on a machine without the CUDA wheels, every library is
    reported missing with where it looked; with them, every library loads."""
    stack = REAL_COLLECT({"PATH": "/usr/bin:/bin"}, 60)
    assert set(stack.libraries) == set(cudalibs.LIBRARY_NAMES)
    for name in stack.missing:
        assert spec(name).soname in (stack.library(name).error or "")
    assert stack.wheel_root.endswith("nvidia")


def test_child_that_hangs_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nsleep 5\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    stack = REAL_COLLECT({}, 0.2)
    assert "did not answer within 0.2 s" in (stack.library("cudnn").error or "")
