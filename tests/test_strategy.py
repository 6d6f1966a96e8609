"""The strategy factory: all-reduce choice, refusals that name valid values, TF_CONFIG."""

from __future__ import annotations

import json

import pytest

from mgpu_env.errors import ConfigError
from mgpu_env.strategy import parse_tf_config, plan_strategy

GPUS2 = ["/device:GPU:0", "/device:GPU:1"]
CPUS2 = ["/device:CPU:0", "/device:CPU:1"]


def test_one_device_takes_the_mirrored_path_with_nothing_to_reduce() -> None:
    plan = plan_strategy("auto", ["/device:CPU:0"], "CPU", 1)
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
    plan = plan_strategy("auto", devices, kind, physical, nccl_available=nccl)
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
        plan_strategy("nccl", devices, kind, physical, nccl_available=nccl)
    message = str(caught.value)
    assert why in message
    assert "Valid values here are [auto, hierarchical_copy, reduction_to_one]" in message
    assert "Supplied value: nccl" in message


def test_explicit_choices_are_kept() -> None:
    for name in ("hierarchical_copy", "reduction_to_one"):
        assert plan_strategy(name, GPUS2, "GPU", 2).cross_device_ops == name


def test_unknown_value_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"\[auto, nccl, hierarchical_copy, reduction_to_one\]"
                       r"\. Supplied value: ring"):
        plan_strategy("ring", GPUS2, "GPU", 2)


def test_tf_config_gives_a_multi_worker_plan_and_a_role() -> None:
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    role = parse_tf_config(json.dumps(config))
    assert role is not None and role.num_workers == 2 and not role.is_chief
    first = parse_tf_config(json.dumps({**config, "task": {"type": "worker", "index": 0}}))
    assert first is not None and first.is_chief  # no chief listed: worker 0 writes outputs
    plan = plan_strategy("auto", GPUS2, "GPU", 2, role=role)
    assert plan.kind == "multi_worker" and plan.cross_device_ops == "nccl"
    with_chief = {"cluster": {"chief": ["c:0"], "worker": ["a:1"]},
                  "task": {"type": "worker", "index": 0}}
    role = parse_tf_config(json.dumps(with_chief))
    assert role is not None and not role.is_chief and role.num_workers == 2


def test_bad_tf_config_is_a_config_error() -> None:
    assert parse_tf_config("") is None
    with pytest.raises(ConfigError, match="TF_CONFIG is not valid"):
        parse_tf_config("{not json")
