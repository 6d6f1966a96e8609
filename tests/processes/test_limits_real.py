"""The address-space estimate against real TensorFlow: a child that imports TensorFlow, builds
MirroredStrategy on 2 logical CPUs and fits through a tf.data map runs under RLIMIT_AS set to
what `doctor.demand` says this machine needs, and fails under half of it. (RLIMIT_AS binds
root too; RLIMIT_NPROC does not, and counts every process of the user, so the thread estimate
was checked by hand: docs/doctor.md.)"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from mgpu_env.doctor.demand import Sizing, demand_for

pytest.importorskip("tensorflow")

CHILD = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(4)])
    model.compile("sgd", "mse")
data = tf.data.Dataset.from_tensor_slices((tf.zeros([64, 4]), tf.zeros([64, 4]))).batch(8)
data = data.map(lambda x, y: (x, y), num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
model.fit(data, epochs=1, verbose=0)
print("fitted")
"""


def run_under(address_space: int) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=300, preexec_fn=limit, check=False,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "-1",
                               "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.slow
def test_tensorflow_runs_within_the_estimate_and_not_under_half_of_it() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack = None if soft == resource.RLIM_INFINITY else soft
    need = demand_for(Sizing(len(os.sched_getaffinity(0)), 0, stack_soft=stack)).address_space
    within = run_under(need)
    assert within.returncode == 0 and "fitted" in within.stdout, within.stderr[-2000:]
    under = run_under(need // 2)
    assert under.returncode != 0, under.stdout
