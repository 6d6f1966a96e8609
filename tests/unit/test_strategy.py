"""The strategy factory: all-reduce choice, refusals that name valid values, TF_CONFIG."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.hardware.devices import DeviceSplit
from mgpu_env.runtime.strategy import WorkerRole, plan_strategy

GPUS2 = ["/device:GPU:0", "/device:GPU:1"]
CPUS2 = ["/device:CPU:0", "/device:CPU:1"]


def split(devices: Sequence[str], kind: str, physical: int) -> DeviceSplit:
    """The split whose names are `devices`: `physical` devices, each split evenly."""
    made = DeviceSplit(kind, physical, len(devices) // physical)
    assert made.names == tuple(devices)
    return made


def test_one_device_takes_the_mirrored_path_with_nothing_to_reduce() -> None:
    plan = plan_strategy("auto", split(["/device:CPU:0"], "CPU", 1))
    assert (plan.kind, plan.local_replicas, plan.cross_device_ops) == ("mirrored", 1, "none")
    assert plan.role.is_chief


@pytest.mark.parametrize(
    ("devices", "kind", "physical", "nccl", "expected"),
    [
        (GPUS2, "GPU", 2, True, "nccl"),
        (GPUS2, "GPU", 1, True, "reduction_to_one"),  # logical GPUs sharing one card
        (GPUS2, "GPU", 2, False, "hierarchical_copy"),  # e.g. Windows: no NCCL
        (CPUS2, "CPU", 1, True, "reduction_to_one"),
    ],
)
def test_auto_avoids_nccl_where_it_cannot_work(
    devices: list[str], kind: str, physical: int, nccl: bool, expected: str
) -> None:
    plan = plan_strategy("auto", split(devices, kind, physical), nccl_available=nccl)
    assert plan.cross_device_ops == expected
    assert plan.reason.startswith("auto")


@pytest.mark.parametrize(
    ("devices", "kind", "physical", "nccl", "why"),
    [
        (CPUS2, "CPU", 1, True, "CPU devices"),
        (GPUS2, "GPU", 1, True, "share 1 physical GPU"),
        (GPUS2, "GPU", 2, False, "no NCCL"),
    ],
)
def test_forced_nccl_is_refused_with_valid_values_and_the_supplied_one(
    devices: list[str], kind: str, physical: int, nccl: bool, why: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_strategy("nccl", split(devices, kind, physical), nccl_available=nccl)
    message = str(caught.value)
    assert why in message
    assert "Valid values here are [auto, hierarchical_copy, reduction_to_one]" in message
    assert "Supplied value: nccl" in message


def test_explicit_choices_are_kept() -> None:
    for name in ("hierarchical_copy", "reduction_to_one"):
        assert plan_strategy(name, split(GPUS2, "GPU", 2)).cross_device_ops == name


def test_unknown_value_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"\[auto, nccl, hierarchical_copy, reduction_to_one\]"
                       r"\. Supplied value: ring"):
        plan_strategy("ring", split(GPUS2, "GPU", 2))


def test_a_multi_worker_role_gives_a_multi_worker_plan() -> None:
    # TF_CONFIG parsing itself is mgpu_env.training.multiworker's (tests/unit/test_multiworker.py).
    role = WorkerRole("worker", 1, 2, _has_chief=False)
    assert not role.is_chief  # no chief listed: worker 0 writes the outputs
    assert WorkerRole("worker", 0, 2, _has_chief=False).is_chief
    plan = plan_strategy("auto", split(GPUS2, "GPU", 2), role=role)
    assert plan.kind == "multi_worker" and plan.cross_device_ops == "nccl"
    assert not WorkerRole("worker", 0, 2, _has_chief=True).is_chief


@pytest.mark.parametrize(
    ("requested", "devices", "role", "note"),
    [
        ("nccl", ("/device:CPU:0",), None, "CROSS_DEVICE_OPS=nccl is not used: with one replica"),
        ("auto", ("/device:CPU:0",), None, ""),
        ("hierarchical_copy", ("/device:CPU:0",), WorkerRole("worker", 0, 2),
         "CROSS_DEVICE_OPS=hierarchical_copy is not used: between workers"),
        ("auto", ("/device:CPU:0",), WorkerRole("worker", 0, 2), ""),
    ],
)
def test_an_overridden_request_is_said(
    requested: str, devices: tuple[str, ...], role: WorkerRole | None, note: str
) -> None:
    plan = plan_strategy(requested, split(devices, "CPU", 1), role=role)
    assert plan.note.startswith(note) if note else plan.note == ""
