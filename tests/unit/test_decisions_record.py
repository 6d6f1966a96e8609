"""The runtime's record (`runtime.record.decide`): each part decided by its one rule, and
where the settings cannot form a runtime, what each other part decided and why the failed
one failed, so the doctor judges them without deciding again."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import SettingsErrors
from mgpu_env.runtime import Decisions, decide, probe_machine
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus

Install = Callable[[FakeNvml], FakeNvml]
VOLTAS = [FakeGpu(name="Tesla V100-SXM2-32GB", compute_capability=(7, 0)) for _ in range(4)]
# Slurm's second task of two on one node: it trains on the second half of the node's GPUs.
SECOND_TASK = {
    "SLURM_JOB_ID": "42", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_LOCALID": "1",
}


def decided(environ: Mapping[str, str]) -> Decisions:
    resolved = resolve_settings({}, environ)
    return decide(resolved, probe_machine(resolved.settings, environ), command="train")


def test_a_precision_the_gpus_cannot_run_keeps_the_workers_share(use_fake_nvml: Install) -> None:
    """bf16 on Volta under Slurm: the precision fails, and the GPUs the doctor judges are
    still this task's share (the GPUs training would use), not the whole node's."""
    use_fake_nvml(fake_gpus(VOLTAS))
    record = decided({**SECOND_TASK, "MIXED_PRECISION": "bf16"})
    assert list(record.failures) == ["precision"]
    assert record.selection is not None
    assert [gpu.index for gpu in record.selection.gpus] == [2, 3]
    assert record.cluster is not None and record.cluster.cluster is not None
    assert record.keras is not None and record.strategy_plan is not None
    assert record.precision is None
    message = record.error("precision")
    assert message is not None and "MIXED_PRECISION=bf16" in message and "Fix:" in message
    with pytest.raises(ConfigError) as refused:
        record.runtime()
    assert str(refused.value) == message
    assert record.decided()["gpus"] == [2, 3] and record.decided()["precision"] is None


def test_a_gpu_the_machine_lacks_is_refused_as_the_setting(use_fake_nvml: Install) -> None:
    """GPUS=7 on four GPUs: the doctor gets the reason alone, training the bad setting
    with its value, source and fix; the cluster and the Keras are still decided."""
    use_fake_nvml(fake_gpus(VOLTAS))
    record = decided({"GPUS": "7"})
    assert list(record.failures) == ["gpus"]
    reason = record.error("gpus")
    assert reason is not None and not reason.startswith("Bad setting")
    assert record.cluster is not None and record.keras is not None
    assert record.split is None and record.precision is None  # need the GPUs: undecided
    with pytest.raises(SettingsErrors) as refused:
        record.runtime()
    assert refused.value.errors[0].startswith("Bad setting GPUS='7'") and reason in str(
        refused.value)


def test_a_cluster_described_twice_leaves_the_rest_decided_for_one_process(
    use_fake_nvml: Install,
) -> None:
    use_fake_nvml(fake_gpus(VOLTAS[:2]))
    record = decided({"WORKER_HOSTS": "localhost:1,localhost:2", "WORKER_INDEX": "0",
                      "TF_CONFIG": '{"cluster": {"worker": ["localhost:1"]}, '
                                   '"task": {"type": "worker", "index": 0}}',
                      "MIXED_PRECISION": "1"})
    assert list(record.failures) == ["cluster"]
    error = record.error("cluster")
    assert error is not None and "Both TF_CONFIG and WORKER_HOSTS" in error
    assert record.precision is not None and record.precision.policy == "mixed_float16"
    assert record.decided()["replicas"] == 2 and record.decided()["cluster"] is None


def test_a_whole_record_is_the_runtime_training_starts_from(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus(VOLTAS))
    record = decided({**SECOND_TASK, "MIXED_PRECISION": "1"})
    runtime = record.runtime()
    assert not record.failures
    assert runtime.selection == record.selection and runtime.precision == record.precision
    assert runtime.decided() == {k: v for k, v in record.decided().items() if k != "errors"}
    assert runtime.decided()["replicas"] == 4  # two GPUs here, two workers
    assert runtime.global_batch_size == runtime.settings.batch_size * 4


def test_the_execution_a_child_is_sent_comes_back_whole(use_fake_nvml: Install) -> None:
    """A child reads the parent's decisions from `Execution.to_json`: the same record
    comes back, with the strategy plan under the "strategy" key children have always read."""
    import json

    from mgpu_env.runtime import Execution

    use_fake_nvml(fake_gpus(VOLTAS))
    execution = decided(SECOND_TASK).runtime().execution
    sent = execution.to_json()
    assert json.loads(sent)["strategy"]["role"]["num_workers"] == 2
    assert "strategy_plan" not in json.loads(sent)
    assert Execution.from_json(sent) == execution
