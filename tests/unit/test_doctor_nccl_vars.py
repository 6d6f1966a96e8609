"""NCCL's variables judged against a machine's /sys/class/net and /sys/class/infiniband and
NCCL's documented values: every variable with a closed set of values is walked value by
value; interface lists by NCCL's matching rules (prefix, `=` exact, `^` exclude, commas)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from mgpu_env.doctor import facts as probes
from mgpu_env.doctor.checks import check_nccl_variables
from mgpu_env.hardware import ncclenv
from tests.support.fake_doctor import make_facts
from tests.support.fake_nvml import FakeNvml, fake_with

Install = Callable[[FakeNvml], FakeNvml]

NET = ("docker0", "eno1", "eth0", "eth1", "ib0", "lo")
IB = ("mlx5_0", "mlx5_1")


@pytest.mark.parametrize(("value", "chosen"), [
    ("eth", ("eth0", "eth1")), ("=eth0", ("eth0",)), ("=eth0,eth1", ("eth0", "eth1")),
    ("^docker", ("eno1", "eth0", "eth1", "ib0", "lo")), ("^=docker0,lo", ("eno1", "eth0", "eth1",
                                                                     "ib0")),
    ("en,ib", ("eno1", "ib0")), ("=eth", ()), ("ens", ()), ("^e,d,i,l", ()),
])
def test_interface_lists_match_as_nccl_matches(value: str, chosen: tuple[str, ...]) -> None:
    assert ncclenv.Matcher.parse(value).chosen(NET) == chosen
    findings = ncclenv.judge({"NCCL_SOCKET_IFNAME": value}, NET, IB)
    assert bool(findings) == (not chosen)
    if findings:
        assert findings[0].status == "error" and "eth0" in findings[0].fix


def test_hca_with_port_and_ib_disabled() -> None:
    assert not ncclenv.judge({"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}, NET, IB)
    wrong = ncclenv.judge({"NCCL_IB_HCA": "mlx4"}, NET, IB)
    assert wrong[0].status == "error" and "mlx5_0, mlx5_1" in wrong[0].problem
    assert not ncclenv.judge({"NCCL_IB_HCA": "mlx4", "NCCL_IB_DISABLE": "1"}, NET, IB)


CLOSED = [(name, value) for name, values in ncclenv.CHOICES.items() for value in values] + [
    (name, value) for name in ncclenv.SWITCHES for value in ncclenv.ON_OFF]


@pytest.mark.parametrize(("name", "value"), CLOSED)
def test_every_documented_value_passes_and_a_wrong_one_fails(name: str, value: str) -> None:
    assert not ncclenv.judge({name: value.lower()}, NET, IB)
    wrong = ncclenv.judge({name: value + "X"}, NET, IB)
    assert wrong[0].status == "error" and value in wrong[0].fix


@pytest.mark.parametrize(("name", "values"), ncclenv.LISTS.items())
def test_lists_take_every_value_exclusions_and_per_collective_forms(
    name: str, values: tuple[str, ...],
) -> None:
    assert not ncclenv.judge({name: ",".join(v.lower() for v in values)}, NET, IB)
    assert not ncclenv.judge({name: "^" + values[0]}, NET, IB)
    assert not ncclenv.judge({name: f"allreduce:{values[0]};broadcast:^{values[-1]}"}, NET, IB)
    wrong = ncclenv.judge({name: f"{values[0]},Bogus"}, NET, IB)
    assert wrong[0].problem.startswith("Bogus: not a value NCCL knows")


@pytest.mark.parametrize(("typo", "meant"), [
    ("NCCL_SOCKET_IFNAMES", "NCCL_SOCKET_IFNAME"), ("NCCL_P2P_DISABLED", "NCCL_P2P_DISABLE"),
    ("NCCL_IB_HCAS", "NCCL_IB_HCA"), ("NCCL_DEBUG_SUBSYSTEM", "NCCL_DEBUG_SUBSYS"),
])
def test_unknown_names_are_likely_typos(typo: str, meant: str) -> None:
    finding = ncclenv.judge({typo: "1"}, NET, IB)[0]
    assert finding.status == "warn" and f"did you mean {meant}?" in finding.fix


def test_every_known_name_is_known() -> None:
    for name in ncclenv.KNOWN:
        assert all(f.status != "warn" for f in ncclenv.judge({name: "1"}, NET, IB)), name


def test_the_check_reads_the_machine(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(2))
    for name in NET:
        (tmp_path / "sys/class/net" / name).mkdir(parents=True)
    environ = {"NCCL_SOCKET_IFNAME": "=ens5", "NCCL_ALGO": "ring"}
    facts = dataclasses.replace(make_facts("all", environ=environ),
                                nccl=probes.probe_nccl(environ, tmp_path))
    checks = check_nccl_variables(facts)
    assert isinstance(checks, list) and [c.status for c in checks] == ["error"]
    assert "NCCL_SOCKET_IFNAME='=ens5'" in checks[0].found and "eth0" in checks[0].found
    unset = dataclasses.replace(facts, nccl=probes.probe_nccl({}, tmp_path))
    assert check_nccl_variables(unset).status == "ok"  # type: ignore[union-attr]


def test_only_a_warning_where_nccl_is_not_used(use_fake_nvml: Install, tmp_path: Path) -> None:
    use_fake_nvml(fake_with(1))
    environ = {"NCCL_SOCKET_IFNAME": "=ens5"}
    facts = dataclasses.replace(make_facts("all", environ=environ),
                                nccl=probes.probe_nccl(environ, tmp_path))
    (check,) = check_nccl_variables(facts)  # type: ignore[misc]
    assert check.status == "warn" and "(NCCL is not used by this run)" in check.found


def test_the_preflight_stops_on_an_interface_this_machine_lacks(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mgpu_env.config.resolve import resolve_settings
    from mgpu_env.doctor import preflight
    from mgpu_env.runtime import build_runtime
    from mgpu_env.tfprobes import tfprobe
    from tests.support.fake_doctor import tf_facts

    use_fake_nvml(fake_with(2))
    monkeypatch.setattr(tfprobe, "collect_in_process", lambda: tf_facts(gpus=2))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=no-such-interface0")
    runtime = build_runtime(resolve_settings({"GPUS": "0,1"}, {}), command="train")
    runtime.apply()
    (failed,) = preflight(runtime)
    assert failed.id == "nccl.variables.NCCL_SOCKET_IFNAME" and failed.status == "error"
