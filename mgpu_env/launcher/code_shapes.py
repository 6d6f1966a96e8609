"""TensorFlow breaking changes that a name cannot show, only the shape of the code (`ast`).

Each function takes one node and says whether it has the shape that fails since the release
in `tensorflow_breaks.BREAKS` named by its key:

- `schedule-int64-step` (2.11): a `LearningRateSchedule` whose `__call__` puts its step,
  not cast, into a float-only op (`tf.math.rsqrt(step)`): the new optimizers pass an int64
  step, which TensorFlow refuses there; `schedule-int64-arithmetic`: into float arithmetic
  (`step * 0.5`, `step ** -1.5`), which fails under tf_keras (an int64 tensor) and works
  under Keras 3 (an int64 variable, whose operators promote). `step / 100` is true division
  and works under both, so it is not flagged;
- `tensor-type` (2.14): `type(t) == tf.Tensor` (or `is`), false for every tensor now;
- `reduce-axis` (2.0): `strategy.reduce(op, value)` without the now required `axis`;
- `trace-profiler` (2.16): `tf.summary.trace_on(profiler=True)` without `profiler_outdir`.
"""

from __future__ import annotations

import ast

# TensorFlow ops that take only floating (or complex) tensors: an int64 step fails there.
FLOAT_ONLY_CALLS = frozenset({"rsqrt", "sqrt", "exp", "log", "cos", "sin", "tanh", "sigmoid",
                              "floor", "ceil"})
# Two-operand ops: an int64 step fails with a float beside it (an int literal is fine).
MIXED_CALLS = frozenset({"pow", "minimum", "maximum", "multiply", "subtract", "add"})
# What converts the step first.
CASTS = frozenset({"cast", "float", "to_float", "convert_to_tensor", "saturate_cast"})
# Arithmetic in which an int64 tensor and a Python float (or float tensor) fail.
FLOAT_OPS = (ast.Mult, ast.Pow, ast.Add, ast.Sub)


def _leaf(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _casts(node: ast.AST) -> bool:
    """Whether `node` converts a value to a float (tf.cast, tf.dtypes.cast, float())."""
    return any(isinstance(call, ast.Call) and _leaf(call.func) in CASTS
               for call in ast.walk(node))


def _step_in_float_math(body: list[ast.stmt], step: str) -> tuple[int, str] | None:
    """(line, "op" | "arithmetic") where the uncast `step` first meets a float-only op or
    float arithmetic; None when the body casts it first (`step = tf.cast(step, ...)`).
    A reassignment without a cast (`step = step + 1`) keeps it int64."""
    function = ast.Module(body=body, type_ignores=[])
    cast_at = min((node.lineno for node in ast.walk(function)
                   if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                   and any(isinstance(t, ast.Name) and t.id == step for t in (
                       node.targets if isinstance(node, ast.Assign) else [node.target]))
                   and node.value is not None and _casts(node.value)), default=None)
    found: list[tuple[int, str]] = []
    for node in ast.walk(function):
        if cast_at is not None and getattr(node, "lineno", 0) >= cast_at:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, FLOAT_OPS) and any(
                isinstance(side, ast.Name) and side.id == step and not _is_int(other)
                for side, other in ((node.left, node.right), (node.right, node.left))):
            found.append((node.lineno, "arithmetic"))
        if not isinstance(node, ast.Call) or not any(
                isinstance(arg, ast.Name) and arg.id == step for arg in node.args):
            continue
        others = [arg for arg in node.args if not (isinstance(arg, ast.Name) and arg.id == step)]
        if _leaf(node.func) in FLOAT_ONLY_CALLS or (
                _leaf(node.func) in MIXED_CALLS and not all(map(_is_int, others))):
            found.append((node.lineno, "op"))
    ops = sorted(item for item in found if item[1] == "op")
    ranked = ops or sorted(found)
    return ranked[0] if ranked else None


def schedule_int64_step(node: ast.ClassDef) -> tuple[int, str] | None:
    """(line, how) for a LearningRateSchedule subclass's `__call__` that puts the int64
    step into a float-only TensorFlow op ("op": fails under tf_keras and Keras 3) or into
    float arithmetic ("arithmetic": fails under tf_keras; Keras 3 passes a variable whose
    operators promote it); None when the class is no schedule or casts the step first."""
    if not any(_leaf(base) == "LearningRateSchedule" for base in node.bases):
        return None
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__call__" and len(
                item.args.args) >= 2:
            return _step_in_float_math(item.body, item.args.args[1].arg)
    return None


def tensor_type_compare(node: ast.Compare) -> bool:
    """`type(x) == tf.Tensor` / `is` / `!=`: exact-type tests of a tensor."""
    sides = [node.left, *node.comparators]
    has_type_call = any(isinstance(side, ast.Call) and _leaf(side.func) == "type"
                        for side in sides)
    has_tensor = any(isinstance(side, ast.Attribute) and side.attr == "Tensor" for side in sides)
    return has_type_call and has_tensor and all(
        isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) for op in node.ops)


def reduce_without_axis(node: ast.Call, receiver: str | None) -> bool:
    """`strategy.reduce(op, value)` with no axis (required since 2.0)."""
    return (_leaf(node.func) == "reduce" and receiver is not None
            and "strategy" in receiver.split(".")[-1].lower() and len(node.args) == 2
            and not any(item.arg == "axis" for item in node.keywords))


def trace_on_profiler(node: ast.Call) -> bool:
    """`trace_on(profiler=True)` with no `profiler_outdir` (required since 2.16)."""
    if _leaf(node.func) != "trace_on":
        return False
    keywords = {item.arg: item.value for item in node.keywords}
    profiler = keywords.get("profiler", node.args[1] if len(node.args) > 1 else None)
    return (isinstance(profiler, ast.Constant) and profiler.value is True
            and "profiler_outdir" not in keywords and len(node.args) < 3)


__all__ = ["reduce_without_axis", "schedule_int64_step", "tensor_type_compare",
           "trace_on_profiler"]
