"""Results read by position where Keras 3 orders them differently from Keras 2.

The model (Keras 3.15 `Trainer.metrics`, `get_metrics_result`, `_flatten_metrics_in_order`,
`python_utils.pythonify_logs`; tf_keras 2.21 `Model.metrics`, `flatten_metrics_in_order`;
both measured, tests/processes/test_source_scan.py):

- Keras 2 gives every result in one order: `loss`, each output's loss (`{out}_loss`, when
  there are several outputs), then the compiled metrics (each output's in turn, `{out}_{m}`),
  then weighted metrics: as a list (`evaluate`, `test_on_batch`, `train_on_batch`) and as the
  keys of `history.history` and of `return_dict=True`.
- Keras 3's list is the same for one output. With several outputs its metric names do not
  match the logs' keys, so they come after the outputs' losses in alphabetical order.
- Keras 3's dicts (`history.history`, `return_dict=True`) are in alphabetical order, for
  every model: `['accuracy', 'loss']` where Keras 2 gave `['loss', 'accuracy']`.

So a read by position gets another value exactly where the two orders differ. The scan
takes the names from the `compile()` call before the read (the nearest one above it, else
the first in the file): strings, metric classes (their default names) and `name=`; a metric
it cannot name, a model whose output names it cannot see (lists of metrics per output),
and a compile it cannot find leave the read alone (the order is unknown, never guessed).
A dict of metrics is taken in the order of its keys, as the model's outputs.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

RESULT_METHODS = ("evaluate", "test_on_batch", "train_on_batch")


@dataclass(frozen=True)
class Order:
    """Both Keras' orders for one compile: None where the scan cannot tell."""

    keras_2: tuple[str, ...] | None  # list and dict order alike
    keras_3_list: tuple[str, ...] | None

    @property
    def keras_3_dict(self) -> tuple[str, ...] | None:
        return None if self.keras_2 is None else tuple(sorted(self.keras_2))


@dataclass(frozen=True)
class PositionalRead:
    """A read by position whose value differs between Keras 2 and Keras 3."""

    line: int
    shown: str  # the code, shortened
    kind: str  # "list" (evaluate's list), "dict" (history.history, return_dict=True) or
    # "names" (model.metrics_names, which Keras 3 fills with one "compile_metrics")
    keras_2: tuple[str, ...]
    keras_3: tuple[str, ...]

    def why(self) -> str:
        if self.kind == "names":
            return (f"pairs `metrics_names` with results, and Keras 3's is "
                    f"[{', '.join(self.keras_3)}] (the compiled metrics are one entry) where "
                    f"Keras 2's was [{', '.join(self.keras_2)}]. Fix: "
                    f"model.evaluate(..., return_dict=True), which names each value")
        by_name = ("model.evaluate(..., return_dict=True)['name']" if self.kind == "list"
                   else "history.history['name']")
        return (f"reads results by position, and Keras 3 orders them "
                f"[{', '.join(self.keras_3)}] where Keras 2 gave [{', '.join(self.keras_2)}]. "
                f"Fix: read them by name ({by_name})")


def snake_case(name: str) -> str:
    """A metric class's default name, as Keras makes it (`to_snake_case`)."""
    intermediate = re.sub("(.)([A-Z][a-z0-9]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", intermediate).lower()


def _metric_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call):
        for item in node.keywords:
            if item.arg == "name":
                value = item.value
                return value.value if isinstance(value, ast.Constant) and isinstance(
                    value.value, str) else None
        func = node.func
        leaf = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return snake_case(leaf) if leaf[:1].isupper() else None
    return None


def _names(node: ast.AST | None) -> tuple[str, ...] | None:
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return ()
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    names = [_metric_name(item) for item in items]
    return None if None in names else tuple(str(name) for name in names)


def _keyword(call: ast.Call, name: str, position: int) -> ast.AST | None:
    for item in call.keywords:
        if item.arg == name:
            return item.value
    return call.args[position] if len(call.args) > position else None


def compile_order(call: ast.Call) -> Order:
    """The two orders a `compile(...)` call gives (see the module's docstring)."""
    loss = _keyword(call, "loss", 1)
    metrics = _keyword(call, "metrics", 2)
    weighted = _names(_keyword(call, "weighted_metrics", 5))
    if isinstance(metrics, ast.Dict) or isinstance(loss, ast.Dict):
        keys = metrics.keys if isinstance(metrics, ast.Dict) else loss.keys  # type: ignore[union-attr]
        outputs = [k.value for k in keys if isinstance(k, ast.Constant) and isinstance(
            k.value, str)]
        if len(outputs) != len(keys):
            return Order(None, None)
        per_output = dict(zip(outputs, metrics.values, strict=True)) if isinstance(
            metrics, ast.Dict) else {}
        named = {out: _names(per_output.get(out)) for out in outputs}
        if any(value is None for value in named.values()) or weighted:
            return Order(None, None)
        losses = [f"{out}_loss" for out in outputs] if len(outputs) > 1 else []
        metric_keys = [f"{out}_{m}" for out in outputs for m in named[out] or ()]
        keras_2 = ("loss", *losses, *metric_keys)
        return Order(keras_2, ("loss", *losses, *sorted(metric_keys)) if losses else keras_2)
    if isinstance(loss, (ast.List, ast.Tuple)) and len(loss.elts) > 1:
        return Order(None, None)  # several outputs named in the model only
    names = _names(metrics)
    if names is None or weighted is None:
        return Order(None, None)
    keras_2 = ("loss", *names, *weighted)
    return Order(keras_2, keras_2)


def _result_call(node: ast.AST) -> ast.Call | None:
    """`x.evaluate(...)` (or test_on_batch/train_on_batch) returning a list."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in RESULT_METHODS:
        as_dict = _keyword(node, "return_dict", 99)
        return None if isinstance(as_dict, ast.Constant) and as_dict.value else node
    return None


def _returns_dict(node: ast.AST) -> bool:
    """`x.evaluate(..., return_dict=True)` (or test_on_batch/train_on_batch)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in RESULT_METHODS and _result_call(node) is None


def _dict_source(node: ast.AST, dicts: set[str]) -> bool:
    """`h.history`, `evaluate(..., return_dict=True)` or a name bound to that."""
    return (isinstance(node, ast.Attribute) and node.attr == "history") or (
        isinstance(node, ast.Name) and node.id in dicts) or _returns_dict(node)


def _dict_view(node: ast.AST, dicts: set[str]) -> bool:
    """`h.history.values()/keys()/items()`, `list(h.history)` and such views."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("values", "keys", "items") and not node.args:
        return _dict_source(node.func.value, dicts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in ("list", "tuple") and len(node.args) == 1:
        return _dict_view(node.args[0], dicts) or _dict_source(node.args[0], dicts)
    return False


def _index(node: ast.AST) -> int | None:
    """`1` or `-1` as written in a subscript; None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _index(node.operand)
        return None if inner is None else -inner
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _reads(nodes: list[ast.AST]) -> list[tuple[ast.AST, str, int | None]]:
    """Every read by position: (node, "list" | "dict", the index read, None for all)."""
    lists: set[str] = set()
    dicts: set[str] = set()
    found: list[tuple[ast.AST, str, int | None]] = []
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and _result_call(value) is not None:
                lists.add(target.id)
            elif isinstance(target, ast.Name) and isinstance(value, ast.Call) and any(
                    k.arg == "return_dict" for k in value.keywords):
                dicts.add(target.id)
    for node in nodes:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], (ast.Tuple, ast.List)):
            if _result_call(node.value) is not None:
                found.append((node, "list", None))
            elif _dict_view(node.value, dicts):
                found.append((node, "dict", None))
        elif isinstance(node, ast.Subscript) and (index := _index(node.slice)) is not None:
            value = node.value
            if _result_call(value) is not None or (
                    isinstance(value, ast.Name) and value.id in lists):
                found.append((node, "list", index))
            elif _dict_view(value, dicts):
                found.append((node, "dict", index))
    return found


def _at(names: tuple[str, ...], index: int) -> str | None:
    return names[index] if -len(names) <= index < len(names) else None


def positional_reads(tree: ast.AST) -> list[PositionalRead]:
    """The reads by position in `tree` whose value Keras 3 and Keras 2 order differently."""
    nodes = list(ast.walk(tree))  # one walk, read three times
    compiles = sorted(((node.lineno, compile_order(node)) for node in nodes
                       if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                       and node.func.attr == "compile" and (node.args or node.keywords)),
                      key=lambda item: item[0])
    reads: list[PositionalRead] = []
    for node, kind, index in _reads(nodes):
        line = getattr(node, "lineno", 0)
        before = [order for at, order in compiles if at <= line]
        if not compiles:
            continue
        order = before[-1] if before else compiles[0][1]
        keras_3 = order.keras_3_list if kind == "list" else order.keras_3_dict
        if order.keras_2 is None or keras_3 is None or keras_3 == order.keras_2 or (
                index is not None and _at(keras_3, index) == _at(order.keras_2, index)):
            continue  # unknown, the same order, or the same name at the place read
        text = ast.unparse(node)
        reads.append(PositionalRead(line, text if len(text) <= 80 else text[:77] + "...",
                                    kind, order.keras_2, keras_3))
    for node in nodes:
        if isinstance(node, ast.Attribute) and node.attr == "metrics_names" and compiles:
            line = node.lineno
            order = ([o for at, o in compiles if at <= line] or [compiles[0][1]])[-1]
            if order.keras_2 is None:
                continue
            losses = tuple(n for n in order.keras_2[1:] if n.endswith("_loss"))
            if len(order.keras_2) == 1 + len(losses):
                continue  # no compiled metrics: Keras 3's names are Keras 2's
            reads.append(PositionalRead(line, ast.unparse(node), "names", order.keras_2,
                                        ("loss", "compile_metrics", *losses)))
    return reads


__all__ = ["Order", "PositionalRead", "compile_order", "positional_reads", "snake_case"]
