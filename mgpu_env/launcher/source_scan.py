"""What a script's source says before it runs: Keras 2 era code, a custom loop, its own policy.

`mgpu run` reads the script, and the local modules it imports, with `ast` (no import, no
TensorFlow: a few milliseconds) for:

- what only Keras 2 has, or what Keras 3 refuses (`launcher/keras_3_breaks.py`: the names and
  keywords Keras 3's `tf.keras` lacks, a model saved or checkpointed to a SavedModel path,
  `save_format=`, an integer shape, `optimizer.lr`...): with KERAS=auto the script gets
  tf_keras at the start, not when its first checkpoint fails, and the summary names the API,
  its file:line and why Keras 3 fails. Each rule fails under Keras 3 and works under tf_keras
  2.21 (tests/processes/test_source_scan.py runs both);
- whether the script uses `tf.keras` at all (`tf_keras_use`): a script that does and fails
  under the Keras 3 KERAS=auto chose ends with the KERAS=2 command, whatever its error;
- what neither Keras has any more (`REMOVED`): KERAS=2 would not help, so the note names
  what replaces it;
- `import keras` (Keras 3 itself, whatever TF_USE_LEGACY_KERAS says): tf_keras would then
  mix with Keras 3 objects, so the scan does not switch, and says how to;
- a custom loop (`apply_gradients`) without `LossScaleOptimizer`, and a script that sets its
  own precision policy (`set_global_policy`): what the precision notes need.

The scan is a hint, never a gate: code built at run time (`getattr`, `exec`) is not seen,
and what it misses the failure note (`keras_2_error`) still catches.
"""

from __future__ import annotations

import ast
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import mgpu_env.launcher.code_shapes as code_shapes
import mgpu_env.launcher.keras_3_breaks as breaks
import mgpu_env.launcher.tensorflow_breaks as tensorflow_breaks
from mgpu_env.launcher.result_order import positional_reads
from mgpu_env.launcher.tensorflow_breaks import error_note  # the run's side, for script.py

TENSORFLOW_LINE = "2.21"
# How many local modules the scan follows from the script, at most: a script's own helpers,
# not a whole source tree.
MAX_FILES = 64

# "changed": a TensorFlow release's breaking change (launcher/tensorflow_breaks.py), its
# text in `fix`; "order": a result read by position (launcher/result_order.py).
FindingKind = Literal["keras_2", "removed", "changed", "order"]


@dataclass(frozen=True)
class Said:
    """What a finding says, wherever it is: its kind, and for its kind the fix (removed
    APIs) or why Keras 3 fails on it (Keras 2 code)."""

    kind: FindingKind
    fix: str = ""
    why: str = ""


@dataclass(frozen=True)
class Finding:
    """One use of an API in the source: what, where, and what to do about it."""

    kind: FindingKind
    api: str  # as written: "tf.keras.optimizers.legacy", ".reset_states()", "lr="
    path: str  # the file as shown to the user (relative to the working folder if inside)
    line: int
    fix: str = ""  # for REMOVED: what replaces it
    why: str = ""  # for Keras 2 code: why Keras 3 fails on it

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def describe(self) -> str:
        return f"`{self.api}` at {self.where}"


@dataclass(frozen=True)
class ScriptScan:
    """What the scan found in the script and its local modules."""

    keras_2: tuple[Finding, ...] = ()  # only Keras 2 (tf_keras) has these
    removed: tuple[Finding, ...] = ()  # neither Keras has these
    keras_3_import: Finding | None = None  # `import keras` (or keras_hub...): Keras 3
    apply_gradients: Finding | None = None  # a custom training loop
    loss_scale_optimizer: bool = False  # LossScaleOptimizer is named somewhere
    sets_policy: Finding | None = None  # the script sets its own precision policy
    tf_keras_use: Finding | None = None  # the first `tf.keras` (or `tensorflow.keras`)
    positional: tuple[Finding, ...] = ()  # results read by position (launcher/result_order)
    files: tuple[str, ...] = ()  # the files read
    unreadable: tuple[str, ...] = ()  # files that could not be parsed (a syntax error...)
    seconds: float = 0.0  # the time the scan took

    def keras_2_evidence(self) -> str | None:
        """Why the script needs Keras 2, for KERAS=auto ("`x` at f.py:3", first of n); None
        when nothing says so, or when the script imports Keras 3 itself (tf_keras would not
        change its `keras`)."""
        if not self.keras_2 or self.keras_3_import is not None:
            return None
        more = len(self.keras_2) - 1
        return self.keras_2[0].describe() + (f" and {more} more" if more else "")

    def keras_2_why(self) -> str | None:
        """The first Keras 2 finding and why Keras 3 fails on it, for the start summary."""
        if not self.keras_2:
            return None
        first = self.keras_2[0]
        return f"{first.describe()}: {first.why}" if first.why else first.describe()

    def notes(self, keras_version: str | None = None) -> list[str]:
        """One line each for the start summary: removed APIs, Keras 2 code that imports
        Keras 3 itself, and results read by position where `keras_version` ("2" or "3", the
        Keras `tf.keras` is; None: either) orders them otherwise than the script's Keras."""
        removed = [f for f in self.removed if f.kind != "changed" or keras_version in
                   (*tensorflow_breaks.BY_KEY[f.why].fails_under, None)]
        lines = [f"{finding.describe()}: {finding.fix} ({_under(finding)})"
                 if finding.kind == "changed" else
                 f"{finding.describe()} is gone from TensorFlow {TENSORFLOW_LINE} (under "
                 f"Keras 2 and 3 alike): {finding.fix}" for finding in removed[:3]]
        if len(removed) > 3:
            lines.append(f"{len(removed) - 3} more such line(s): "
                         + ", ".join(f.where for f in removed[3:8]))
        if keras_version != "2" or self.keras_3_import is not None:
            lines.extend(f"{finding.describe()} {finding.why}" for finding in self.positional)
        if self.keras_2 and self.keras_3_import is not None:
            lines.append(
                f"{self.keras_2[0].describe()} is Keras 2 code, but "
                f"{self.keras_3_import.describe()} imports Keras 3 itself, which KERAS=2 "
                "does not change. Fix: `import tf_keras as keras` there, and KERAS=2"
            )
        return lines

    def unscaled_custom_loop(self) -> Finding | None:
        """`apply_gradients` with no LossScaleOptimizer anywhere: a custom loop that would
        train float16 without loss scaling."""
        return None if self.loss_scale_optimizer else self.apply_gradients


def _under(finding: Finding) -> str:
    fails = tensorflow_breaks.BY_KEY[finding.why].fails_under
    return "under Keras 2 and 3 alike" if len(fails) > 1 else f"under Keras {fails[0]}"


# Attribute chains (dotted, matched at the end of what the source writes) that only Keras 2
# has. `tf.keras.X`, `keras.X`, `from tensorflow.keras.X import` and `K.X` all match.
KERAS_2_CHAINS = {
    "optimizers.legacy": "Keras 3 has no optimizers.legacy",
    "optimizers.experimental": "Keras 3 has no optimizers.experimental",
    "layers.experimental": "Keras 3 has no layers.experimental",
    "keras.experimental": "Keras 3 has no tf.keras.experimental",
    "callbacks.experimental": "Keras 3 has no callbacks.experimental",
    "compat.v1.layers": "tf.compat.v1.layers is built on Keras 2 (\"not available with "
                        "Keras 3\")",
}
# Methods only Keras 2 objects have (Keras 3 metrics have `reset_state`; its optimizers and
# LossScaleOptimizer have neither the generators nor get_scaled_loss).
KERAS_2_METHODS = {
    "reset_states": "Keras 3 metrics have reset_state(), not reset_states()",
    "fit_generator": "Keras 3 models have no fit_generator(): fit() takes generators",
    "evaluate_generator": "Keras 3 models have no evaluate_generator()",
    "predict_generator": "Keras 3 models have no predict_generator()",
    "get_scaled_loss": "Keras 3's LossScaleOptimizer has scale_loss(), not get_scaled_loss()",
    "get_unscaled_gradients": "Keras 3's LossScaleOptimizer unscales by itself",
    "add_update": "Keras 3 layers have no add_update()",
}
# tf_keras-based packages whose layers Keras 3 refuses ("Only instances of `keras.Layer`").
KERAS_2_PACKAGES = ("tensorflow_hub",)
# Keras 3 itself, and packages built on it: their objects do not mix with tf_keras'.
KERAS_3_PACKAGES = ("keras", "keras_hub", "keras_nlp", "keras_cv")
# Gone from Keras 2 as well (TensorFlow 2.x removed them): KERAS=2 would not help.
# (TensorFlow's own removals, with their release, are launcher/tensorflow_breaks.py's.)
REMOVED_CHAINS = {
    "wrappers.scikit_learn": "use the scikeras package (scikeras.wrappers.KerasClassifier)",
}
REMOVED_METHODS = {
    "get_session": "use tf.compat.v1.keras.backend.get_session, or TF 2 code",
    "set_session": "use tf.compat.v1.keras.backend.set_session, or TF 2 code",
}
OPTIMIZER_NAMES = frozenset({
    "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl",
})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for Name/Attribute chains, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _chain_match(dotted: str, chains: tuple[str, ...] | dict[str, str]) -> str | None:
    padded = f".{dotted}."
    for chain in chains:
        if f".{chain}." in padded:
            return chain
    return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.keras_2: list[Finding] = []
        self.removed: list[Finding] = []
        self.keras_3_import: Finding | None = None
        self.apply_gradients: Finding | None = None
        self.loss_scale_optimizer = False
        self.sets_policy: Finding | None = None
        self.imports: list[tuple[str, int]] = []  # (module, level) for local modules
        self.tf_keras_use: Finding | None = None
        self.positional: list[Finding] = []
        self.aliases: dict[str, str] = {}  # K -> tensorflow.keras.backend
        self.constants: dict[str, ast.AST] = {}  # names bound once: text_tail reads them
        self._seen: set[tuple[str, int]] = set()

    def _add(self, said: Said, api: str, node: ast.AST, key: str = "") -> None:
        # One finding per rule and line: `a.b.c.d` is visited as `a.b.c.d` and `a.b.c`.
        line = getattr(node, "lineno", 0)
        if (key or api, line) in self._seen:
            return
        self._seen.add((key or api, line))
        finding = Finding(said.kind, api, self.shown, line, said.fix, said.why)
        (self.keras_2 if said.kind == "keras_2" else self.removed).append(finding)

    def _add_break(self, change: tensorflow_breaks.Break, api: str, node: ast.AST) -> None:
        if change.keras_2_runs:
            self._add(Said("keras_2", why=change.says()), api, node, key=change.key)
        else:
            self._add(Said("changed", fix=change.says(), why=change.key), api, node,
                      key=change.key)

    def _expand(self, dotted: str) -> str:
        """`K.x` as `tensorflow.keras.backend.x` when the file imported K so."""
        head, _, rest = dotted.partition(".")
        full = self.aliases.get(head)
        return dotted if full is None else (f"{full}.{rest}" if rest else full)

    def _check_dotted(self, dotted: str, node: ast.AST) -> None:
        full = self._expand(dotted)
        if self.tf_keras_use is None and any(
                word in f".{full}." for word in (".tf.keras.", ".tensorflow.keras.")):
            self.tf_keras_use = Finding("keras_2", dotted, self.shown,
                                        getattr(node, "lineno", 0))
        if (chain := _chain_match(full, KERAS_2_CHAINS)) is not None:
            self._add(Said("keras_2", why=KERAS_2_CHAINS[chain]), dotted, node, key=chain)
        elif (why := breaks.missing_name(full)) is not None:
            self._add(Said("keras_2", why=why), dotted, node)
        elif (found := breaks.attribute_rule(full)) is not None:
            self._add(Said("keras_2", why=found[1]), found[0], node)
        elif (chain := _chain_match(dotted, REMOVED_CHAINS)) is not None:
            self._add(Said("removed", fix=REMOVED_CHAINS[chain]), dotted, node, key=chain)
        elif (change := tensorflow_breaks.chain_break(full)) is not None:
            self._add_break(change, dotted, node)
        if dotted.split(".")[-1] == "LossScaleOptimizer":
            self.loss_scale_optimizer = True

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            # `import tensorflow.compat.v1 as tf`: its tf.Session is compat.v1's, not gone.
            if alias.asname and ("keras" in alias.name.split(".") or
                                 alias.name.startswith("tensorflow.compat")):
                self.aliases[alias.asname] = alias.name
            self._module(alias.name, node)
            self.imports.append((alias.name, 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0:
            self._module(module, node)
            for alias in node.names:
                if "keras" in f"{module}.{alias.name}".split(".") or \
                        module.startswith("tensorflow.compat"):
                    self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
                self._module(f"{module}.{alias.name}", node, names_only=True)
        for alias in node.names:
            self.imports.append((f"{module}.{alias.name}" if module else alias.name,
                                 node.level))
        self.imports.append((module, node.level))

    def _module(self, module: str, node: ast.AST, *, names_only: bool = False) -> None:
        top = module.split(".")[0]
        if top in KERAS_3_PACKAGES and not names_only and self.keras_3_import is None:
            self.keras_3_import = Finding("keras_2", f"import {module}", self.shown,
                                          getattr(node, "lineno", 0))
        if top in KERAS_2_PACKAGES and not names_only:
            self._add(Said("keras_2"), f"import {module}", node)
        self._check_dotted(module, node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        if dotted is not None:
            self._check_dotted(dotted, node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else (
            func.id if isinstance(func, ast.Name) else "")
        # A method's receiver as written ("" for one that is not a name: `model().save`);
        # None for a plain function call.
        receiver = (self._expand(_dotted(func.value) or "")
                    if isinstance(func, ast.Attribute) else None)
        if (why := breaks.file_rule(node, receiver, self.constants)) is not None:
            self._add(Said("keras_2", why=why), _shown_call(node), node)
        elif (found := breaks.call_rule(node, receiver)) is not None:
            self._add(Said("keras_2", why=found[1]), found[0], node)
        if isinstance(func, ast.Attribute):
            if (change := tensorflow_breaks.method_break(name)) is not None:
                self._add_break(change, f".{name}()", node)
            elif name in KERAS_2_METHODS:
                self._add(Said("keras_2", why=KERAS_2_METHODS[name]), f".{name}()", node)
            elif name in REMOVED_METHODS:
                self._add(Said("removed", fix=REMOVED_METHODS[name]), f".{name}()", node)
            elif name == "apply_gradients" and self.apply_gradients is None:
                self.apply_gradients = Finding("keras_2", ".apply_gradients()", self.shown,
                                               node.lineno)
        if (refused := tensorflow_breaks.keyword_break(
                name, {k.arg for k in node.keywords if k.arg})) is not None:
            self._add_break(refused[0], f"{name}({refused[1]}=...)", node)
        if code_shapes.reduce_without_axis(node, receiver):
            self._add_break(tensorflow_breaks.BY_KEY["reduce-axis"], _shown_call(node), node)
        if code_shapes.trace_on_profiler(node):
            self._add_break(tensorflow_breaks.BY_KEY["trace-profiler"], _shown_call(node), node)
        if name in ("set_global_policy", "set_policy") and self.sets_policy is None:
            self.sets_policy = Finding("keras_2", f"{name}()", self.shown, node.lineno)
        if name in OPTIMIZER_NAMES and any(k.arg == "lr" for k in node.keywords):
            self._add(Said("keras_2", why="Keras 3 optimizers take learning_rate=, not lr="),
                      f"{name}(lr=...)", node)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if (found := code_shapes.schedule_int64_step(node)) is not None:
            key = "schedule-int64-step" if found[1] == "op" else "schedule-int64-arithmetic"
            self._add_break(tensorflow_breaks.BY_KEY[key], f"{node.name}.__call__",
                            ast.Pass(lineno=found[0]))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if code_shapes.tensor_type_compare(node):
            self._add_break(tensorflow_breaks.BY_KEY["tensor-type"], ast.unparse(node), node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "LossScaleOptimizer":
            self.loss_scale_optimizer = True


def _shown_call(node: ast.Call) -> str:
    """The call as written, shortened for one line."""
    text = ast.unparse(node)
    return text if len(text) <= 100 else text[:97] + "..."


def _bound_once(tree: ast.AST) -> dict[str, ast.AST]:
    """Names assigned exactly once in the file (`path = "ckpt/cp.ckpt"`), with their value:
    a checkpoint path is most often a name. A name bound twice could be either: left out."""
    values: dict[str, ast.AST] = {}
    twice: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            name = node.targets[0].id
            (twice.add(name) if name in values else values.__setitem__(name, node.value))
    return {name: value for name, value in values.items() if name not in twice}


def _shown(path: Path) -> str:
    try:
        relative = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return str(path)
    return str(relative)


def _local_module(module: str, level: int, importer: Path, roots: tuple[Path, ...]) -> Path | None:
    """The file of `module` if it is the user's own (next to the script, or a relative
    import), else None: installed packages are not read."""
    if not module or not all(_IDENTIFIER.match(part) for part in module.split(".")):
        return None
    parts = module.split(".")
    bases = [importer.parent.parents[level - 2] if level > 1 else importer.parent] if level \
        else list(roots)
    for base in bases:
        candidate = base.joinpath(*parts)
        for path in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if path.is_file():
                return path
    return None


def scan_script(path: Path, roots: tuple[Path, ...] = ()) -> ScriptScan:
    """Scan `path` and the local modules it imports (found under `roots`: the script's folder
    for a script, the working folder for `-m`; at most MAX_FILES files). Never raises for the
    script's content: a file that does not parse is listed in `unreadable`."""
    started = time.perf_counter()
    roots = roots or (path.resolve().parent,)
    queue = [path.resolve()]
    seen: set[Path] = set()
    visitors: list[_Visitor] = []
    unreadable: list[str] = []
    while queue and len(seen) < MAX_FILES:
        current = queue.pop(0)
        if current in seen:
            continue
        seen.add(current)
        try:
            tree = ast.parse(current.read_bytes(), filename=str(current))
        except (OSError, SyntaxError, ValueError):
            unreadable.append(_shown(current))
            continue
        visitor = _Visitor(_shown(current))
        visitor.constants = _bound_once(tree)
        visitor.visit(tree)
        visitor.positional = [
            Finding("order", read.shown, visitor.shown, read.line, why=read.why())
            for read in positional_reads(tree)]
        visitors.append(visitor)
        for module, level in visitor.imports:
            local = _local_module(module, level, current, roots)
            if local is not None and local.resolve() not in seen:
                queue.append(local.resolve())
    return ScriptScan(
        keras_2=tuple(f for v in visitors for f in v.keras_2),
        removed=tuple(f for v in visitors for f in v.removed),
        keras_3_import=next((v.keras_3_import for v in visitors if v.keras_3_import), None),
        apply_gradients=next((v.apply_gradients for v in visitors if v.apply_gradients), None),
        loss_scale_optimizer=any(v.loss_scale_optimizer for v in visitors),
        sets_policy=next((v.sets_policy for v in visitors if v.sets_policy), None),
        tf_keras_use=next((v.tf_keras_use for v in visitors if v.tf_keras_use), None),
        positional=tuple(f for v in visitors for f in v.positional),
        files=tuple(v.shown for v in visitors),
        unreadable=tuple(unreadable),
        seconds=time.perf_counter() - started,
    )


def script_roots(is_module: bool, path: Path) -> tuple[Path, ...]:
    """Where the script's own modules are: its folder (as `python script.py` puts it first
    on sys.path), or the working folder for `-m` (and the module's own folder)."""
    if is_module:
        return (Path(os.getcwd()).resolve(), path.resolve().parent)
    return (path.resolve().parent,)


__all__ = ["Finding", "ScriptScan", "error_note", "scan_script", "script_roots"]
