"""The versions of Python, TensorFlow, Keras and the rest, against the compatibility table.

Python, TensorFlow, Keras and the rest against the compatibility table and the lock; and which
Keras `tf.keras` will be (KERAS)."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import Check, CheckId, Status, check, target_build
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import compat
from mgpu_env.hardware.nvml import Probed

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
VERSIONS = CheckId("versions")
KERAS = CheckId("keras")


@check(150, VERSIONS)
def check_versions(facts: Facts) -> Check:
    title = "Versions"
    row = target_build(facts)
    versions = facts.versions
    found = ", ".join(f"{name} {probed.text()}" for name, probed in versions.items())
    expected = (
        f"Python {row.python_range} for TensorFlow {row.tensorflow}; Keras 3; "
        f"TensorFlow {compat.PINNED_TENSORFLOW} (requirements.lock)"
    )
    problems: list[tuple[Status, str]] = []
    tf_version = versions.get("TensorFlow", Probed())
    python = versions.get("Python", Probed())
    if not tf_version.ok or not tf_version.value:
        problems.append(
            ("error", "TensorFlow is not installed: `pip install -r requirements.lock`")
        )
    elif compat.for_tensorflow(tf_version.value) is None:
        problems.append(("warn", f"TensorFlow {tf_version.value} has no row in "
                                 "mgpu_env/hardware/compat.py: install the pinned version"))
    elif compat.minor_of(tf_version.value) != compat.PINNED_TENSORFLOW:
        problems.append(("warn", f"TensorFlow {tf_version.value} is not the pinned "
                                 f"{compat.PINNED_TENSORFLOW}: `pip install -r requirements.lock`"))
    if python.ok and python.value and not row.supports_python(python.value):
        problems.append(("error", f"Python {python.value} is outside {row.python_range}: use a "
                                  "supported Python (the image ships one)"))
    keras = versions.get("Keras", Probed())
    if keras.ok and keras.value and not keras.value.startswith("3."):
        problems.append(("warn", f"Keras {keras.value} is not Keras 3: "
                                 "`pip install -r requirements.lock`"))
    if not problems:
        return VERSIONS(title, "ok", found, expected)
    status: Status = "error" if any(s == "error" for s, _ in problems) else "warn"
    return VERSIONS(title, status, found, expected, "; ".join(t for _, t in problems))


@check(160, KERAS)
def check_keras(facts: Facts) -> Check:
    """Which Keras a script under `mgpu run` and `mgpu train`'s loop get (KERAS), and why."""
    title = "Keras (tf.keras)"
    expected = ("Keras 2 (tf_keras) for a script between workers, where Keras 3 cannot "
                "train (keras-team/keras#20585); else Keras 3")
    keras = facts.keras
    if keras.error is not None:
        found, _, fix = keras.error.partition("\n")
        return KERAS(title, "error", found, expected,
                     fix.strip().removeprefix("Valid: KERAS=auto, 3 or 2 (2 needs tf_keras). "),
                     bad_setting=True)
    if keras.run is None or keras.train is None:
        return KERAS(title, "skip", "not decided", expected)
    found = f"mgpu run: {keras.run.label} ({keras.run.reason})"
    if keras.train.version != keras.run.version:
        found += f"; mgpu train: {keras.train.label}"
    if keras.run.notes:
        return KERAS(title, "warn", found, expected, "; ".join(keras.run.notes))
    return KERAS(title, "ok", found, expected)
