"""`launcher/run_observer.py` in this process, with real TensorFlow and Keras: the hooks see
the strategy a step runs under (not the last one built), the first step's warning, Keras'
`fit` named at the script's line, layers computing (not a functional model's construction),
the first gradient, and each call that changes Keras' global policy. Every hook is removed
after each test. Whole scripts under `mgpu run`: tests/processes/test_what_ran.py."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mgpu_env.launcher import run_observer, strategy_watch

PLAN = strategy_watch.PlannedReplicas(2, "VIRTUAL_DEVICES planned 2", False)


def line() -> str:
    """This file's place of the caller's line, as the observer writes it."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return f"{run_observer.shown_path(__file__)}:{frame.f_back.f_lineno}"


@pytest.fixture
def observing(logical_cpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`watch` and `observe` installed for the test, and everything they replaced restored."""
    import tensorflow as tf
    from keras.src.layers.layer import Layer
    from tensorflow.dtensor.python import dtensor_device
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.eager import backprop

    del tf
    base = distribute_lib.StrategyBase
    for name in ("__init__", "run", *run_observer.DATA_METHODS):
        monkeypatch.setattr(base, name, base.__dict__[name])
    for cls in run_observer._subclasses(base):
        if "run" in cls.__dict__:
            monkeypatch.setattr(cls, "run", cls.__dict__["run"])
    monkeypatch.setattr(backprop.GradientTape, "gradient", backprop.GradientTape.gradient)
    monkeypatch.setattr(dtensor_device.DTensorDevice, "_register_mesh",
                        dtensor_device.DTensorDevice._register_mesh)
    monkeypatch.setattr(Layer, "__call__", Layer.__dict__["__call__"])
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("keras", "tf_keras") and module is not None:
            for attribute in run_observer.POLICY_SETTERS:
                if attribute in getattr(module, "__dict__", {}):
                    monkeypatch.setattr(module, attribute, module.__dict__[attribute])
    run_observer._reset()
    strategy_watch._reset()
    strategy_watch.watch(PLAN, quiet=True)
    run_observer.observe()
    run_observer.observe()  # twice: still one wrapper each
    yield
    run_observer._reset()
    strategy_watch._reset()


def test_the_strategy_a_step_runs_under_is_seen_with_its_first_step_warning(
    observing: None, logical_cpus: tuple[str, ...], capsys: pytest.CaptureFixture[str],
) -> None:
    import tensorflow as tf

    two = tf.distribute.MirroredStrategy(list(logical_cpus[:2]))
    one = tf.distribute.MirroredStrategy([logical_cpus[0]])
    dataset = tf.data.Dataset.range(4).batch(2)
    two.experimental_distribute_dataset(dataset); data_at = line()  # noqa: E702
    assert capsys.readouterr().err == ""  # built, and data: no step yet
    one.run(lambda: tf.constant(1.0)); one_at = line()  # noqa: E702
    err = capsys.readouterr().err
    assert err.startswith(f"mgpu run: warning: strategy.run at {one_at} runs under "
                          "MirroredStrategy: the script's MirroredStrategy uses 1 device"), err

    @tf.function
    def step() -> Any:
        return two.run(lambda: tf.constant(2.0))

    step(); step_at = line()  # noqa: E702  (traced here: where the tf.function is called)
    step()
    tf.distribute.get_strategy().run(lambda: tf.constant(3.0)); default_at = line()  # noqa: E702
    uses = [(u.strategy.replicas if u.strategy else None, u.how, u.where, u.step)
            for u in run_observer.observed().uses]
    assert uses == [
        (2, "experimental_distribute_dataset", data_at, False),
        (1, "strategy.run", one_at, True),
        (2, "strategy.run", step_at, True),
        (None, "strategy.run", default_at, True),
    ]
    assert "runs on TensorFlow's default strategy (one device, 1 replica), outside" in \
        capsys.readouterr().err


def test_fit_layers_gradients_and_policy_changes_are_observed(
    observing: None, logical_cpus: tuple[str, ...],
) -> None:
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(list(logical_cpus[:2]))
    with strategy.scope():
        inputs = keras.Input((3,))  # a functional model: its layers called on KerasTensors
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(4)(inputs)))
        model.compile(optimizer="sgd", loss="mse")
    seen = run_observer.observed()
    assert not seen.layers and not seen.computed()
    x = np.ones((8, 3), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0); fit_at = line()  # noqa: E702
    # Keras distributes the data, then steps: both are the script's fit.
    assert [(u.how, u.where, u.step) for u in seen.uses] == [
        ("model.fit", fit_at, False), ("model.fit", fit_at, True)]
    use = seen.uses[1]
    assert (use.how, use.where, use.strategy and use.strategy.replicas) == (
        "model.fit", fit_at, 2)
    assert seen.layers == {("float32", "float32"): 2}
    assert seen.gradient is not None and seen.gradient.target_dtypes == ("float32",)
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16"); set_at = line()  # noqa: E702
        keras.mixed_precision.set_global_policy("mixed_bfloat16")  # no change: not recorded
        keras.backend.clear_session(); cleared_at = line()  # noqa: E702
        keras.layers.Dense(2)(np.ones((1, 3), "float32"))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    changes = [(c.call, c.keras, c.where, c.before, c.after) for c in seen.policy_changes]
    assert changes[:2] == [
        ("set_global_policy('mixed_bfloat16')", "Keras 3", set_at, "float32", "mixed_bfloat16"),
        ("clear_session()", "Keras 3", cleared_at, "mixed_bfloat16", "float32"),
    ]
    assert seen.layers == {("float32", "float32"): 3}
