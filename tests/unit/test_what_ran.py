"""The lines after a script under `mgpu run`, from what was observed while it ran
(`launcher/what_ran.py`): each way a run can differ from its plan, as records, no TensorFlow.
The records themselves are taken from real runs in tests/processes/test_what_ran.py."""

from __future__ import annotations

from collections import Counter

from mgpu_env.launcher.run_observer import Gradient, MeshUse, Observed, PolicyChange, Use
from mgpu_env.launcher.strategy_watch import BuiltStrategy, PlannedReplicas, strategy_problem
from mgpu_env.launcher.what_ran import Planned, PlannedPrecision, Seen, what_ran

PLAN = PlannedReplicas(2, "VIRTUAL_DEVICES planned 2", multi_worker=False)
CPUS = ("CPU:0", "CPU:1")
FLOAT32 = PlannedPrecision("float32", "MIXED_PRECISION=0")
BF16 = PlannedPrecision("mixed_bfloat16", "MIXED_PRECISION=bf16")
MIRRORED = BuiltStrategy("MirroredStrategy", CPUS, 2, planned_devices=True)
ONE = BuiltStrategy("MirroredStrategy", ("CPU:0",), 1)
CENTRAL = BuiltStrategy("CentralStorageStrategy", ("CPU:0",), 1)
FLOAT32_LAYERS = Counter({("float32", "float32"): 2})


def lines(observed: Observed, built: tuple[BuiltStrategy, ...] = (), *, failed: bool = False,
          precision: PlannedPrecision = FLOAT32, quiet: bool = False,
          existing: tuple[str, ...] = CPUS) -> list[str]:
    return what_ran(Seen(observed, built, existing), Planned(PLAN, precision, "CPU"),
                    failed=failed, quiet=quiet)


def test_the_strategy_that_ran_is_the_one_stepped_not_the_last_built() -> None:
    seen = Observed(uses=[Use(MIRRORED, "model.fit", "train.py:11", step=True)],
                    layers=FLOAT32_LAYERS)
    said = lines(seen, (MIRRORED, ONE, CENTRAL))
    assert said[0] == (
        "mgpu run: strategy that ran: MirroredStrategy on 2 devices (CPU:0, CPU:1), 2 replicas"
        " in sync: model.fit at train.py:11; the script also built MirroredStrategy (1 replica)"
        ", CentralStorageStrategy (1 replica), and no step ran under them; as planned "
        "(VIRTUAL_DEVICES planned 2)")
    assert "CentralStorageStrategy on" not in "\n".join(said)
    # QUIET=1: a run as planned says nothing.
    assert lines(seen, (MIRRORED, ONE, CENTRAL), quiet=True) == []


def test_devices_the_strategy_names_that_do_not_exist_are_not_as_planned() -> None:
    gpus = BuiltStrategy("MirroredStrategy", ("GPU:0", "GPU:1"), 2)
    seen = Observed(uses=[Use(gpus, "strategy.run", "train.py:9", step=True)])
    (line,) = lines(seen, (gpus,))
    assert "as planned" not in line
    assert ("MirroredStrategy names GPU:0, GPU:1, which TensorFlow does not list here (it "
            "lists CPU:0, CPU:1)") in line and "Fix: drop its devices argument" in line
    # Devices unknown (TensorFlow's runtime never started): the replica count decides.
    assert strategy_problem(gpus, PLAN, ()) is None
    assert strategy_problem(BuiltStrategy("MirroredStrategy", ("GPU:0",), 1), PLAN, ()) \
        is not None


def test_a_step_outside_every_scope_ran_on_the_default_strategy_with_its_fix() -> None:
    seen = Observed(uses=[Use(None, "model.fit", "train.py:20", step=True)],
                    layers=FLOAT32_LAYERS)
    line = lines(seen)[0]
    assert line.startswith("mgpu run: strategy that ran: TensorFlow's default strategy (one "
                           "device, 1 replica): model.fit at train.py:20; "
                           "VIRTUAL_DEVICES planned 2. Fix: build tf.distribute.")
    # It built one, and stepped outside its scope: the fix names that one.
    built = lines(seen, (MIRRORED,))[0]
    assert "inside `with strategy.scope():` of the MirroredStrategy the script built" in built
    # One replica planned: as planned.
    one = what_ran(Seen(seen, (), CPUS),
                   Planned(PlannedReplicas(1, "the plan has 1", False), FLOAT32, "CPU"),
                   failed=False)
    assert one[0].endswith("; as planned (the plan has 1)")


def test_a_loop_without_a_strategy_is_seen_by_its_gradient() -> None:
    seen = Observed(gradient=Gradient(("float32",), ("float32", "float32"), "", "loop.py:10"),
                    layers=FLOAT32_LAYERS)
    line = lines(seen)[0]
    assert line.startswith("mgpu run: strategy that ran: none: the steps at loop.py:10 ran "
                           "outside every strategy, on one device; VIRTUAL_DEVICES planned 2")


def test_a_dtensor_mesh_with_its_own_devices_against_the_plan() -> None:
    devices = tuple(f"CPU:{i}" for i in range(8))
    seen = Observed(meshes=[MeshUse("batch=8", devices, "mesh.py:12")],
                    gradient=Gradient(("float32",), ("float32",) * 2, "batch=8", "mesh.py:31"))
    said = lines(seen, precision=BF16)
    assert said[0] == (
        "mgpu run: mesh that ran: DTensor mesh batch=8 on 8 devices (CPU:0, CPU:1, ..., CPU:7),"
        " laid out at mesh.py:12, its step's gradient at mesh.py:31; VIRTUAL_DEVICES planned "
        "2: the script set up its own 8 CPU devices. Fix: to make the plan what runs, "
        "VIRTUAL_DEVICES=8 (and drop the script's own device split), or build the mesh on the"
        " planned devices")
    assert not any("strategy that ran" in line for line in said)
    # No Keras layer: the policy reached nothing; the step's own dtypes are said.
    assert said[1].startswith("mgpu run: warning: precision that ran: no Keras layer computed;"
                              " the step's gradient at mesh.py:31 was taken of a float32 loss "
                              "for 2 variables float32, not bfloat16")
    assert "not mixed_bfloat16" not in said[1] and "Fix: compute in bfloat16" in said[1]
    # Planned float32: as planned.
    assert lines(seen)[1].endswith("; as planned (MIXED_PRECISION=0)")


def test_clear_session_that_reset_the_policy_is_named_with_its_line() -> None:
    seen = Observed(
        uses=[Use(MIRRORED, "model.fit", "k3.py:13", step=True)],
        layers=Counter({("float32", "float32"): 2}),
        first_layer={("float32", "float32"): "Dense 'dense'"},
        policy_changes=[PolicyChange("clear_session()", "Keras 3", "k3.py:6",
                                     "mixed_bfloat16", "float32")])
    said = lines(seen, (MIRRORED,), precision=BF16)
    assert said[1] == "mgpu run: precision that ran: 2 Keras layers in float32"
    assert said[2] == (
        "mgpu run: warning: clear_session() at k3.py:6 reset Keras 3's global precision "
        "policy, to float32, so the 2 Keras layers built after it computed in float32, not "
        "bfloat16, which MIXED_PRECISION=bf16 planned. Fix: set the policy again after it: "
        "keras.mixed_precision.set_global_policy('mixed_bfloat16')")


def test_a_policy_of_the_scripts_own_and_a_layers_own_dtype() -> None:
    seen = Observed(
        uses=[Use(MIRRORED, "model.fit", "own.py:12", step=True)],
        layers=Counter({("float16", "mixed_float16"): 1, ("float32", "float32"): 1}),
        first_layer={("float16", "mixed_float16"): "Dense 'dense'",
                     ("float32", "float32"): "Dense 'dense_1'"},
        policy_changes=[PolicyChange("set_global_policy('mixed_float16')", "tf_keras",
                                     "own.py:5", "float32", "mixed_float16")])
    said = lines(seen, (MIRRORED,))
    assert said[1] == "mgpu run: precision that ran: 1 Keras layer in float16 (mixed_float16)" \
        ", 1 Keras layer in float32"
    assert said[2] == (
        "mgpu run: note: the script set its own precision policy (tf_keras set_global_policy("
        "'mixed_float16') at own.py:5): the 1 Keras layer built after it computed in float16 "
        "(mixed_float16), not float32, which MIXED_PRECISION=0 planned")
    # Under bf16 with no call of the script's: the float32 layer is its own dtype=.
    mixed = Observed(uses=seen.uses, layers=Counter({("bfloat16", "mixed_bfloat16"): 3,
                                                     ("float32", "float32"): 1}),
                     first_layer={("float32", "float32"): "Activation 'softmax'"})
    assert lines(mixed, (MIRRORED,), precision=BF16)[1] == (
        "mgpu run: precision that ran: 3 Keras layers in bfloat16 (mixed_bfloat16), 1 Keras "
        "layer in float32 (its own dtype: Activation 'softmax'); as planned "
        "(MIXED_PRECISION=bf16)")


def test_no_advice_about_code_that_never_ran() -> None:
    # Failed at import, or after building a strategy and before any step: nothing.
    assert lines(Observed(), failed=True) == []
    assert lines(Observed(), (ONE,), failed=True) == []
    data_only = Observed(uses=[Use(ONE, "experimental_distribute_dataset", "x.py:3", False)])
    assert lines(data_only, (ONE,), failed=True) == []
    # Keras 3 calls its layers on graph tensors to build a model before fit's first step
    # (which may then fail): layers alone are no step.
    built_only = Observed(layers=FLOAT32_LAYERS, first_layer={("float32", "float32"): "D"})
    assert lines(built_only, (ONE,), failed=True) == []
    assert not any("precision" in line for line in lines(built_only, (ONE,)))
    # Ended well without a step: what it built, and no fix.
    (line,) = lines(Observed(), (ONE,))
    assert line == ("mgpu run: no step ran: the script built MirroredStrategy (1 replica) and "
                    "ran nothing under it") and "Fix" not in line
    assert lines(Observed(), (ONE,), quiet=True) == []
    # Failed after its steps: what ran is still said, with its fix.
    ran = Observed(uses=[Use(ONE, "model.fit", "x.py:9", True)], layers=FLOAT32_LAYERS)
    assert "Fix: drop its devices argument" in lines(ran, (ONE,), failed=True)[0]
