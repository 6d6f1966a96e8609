"""The plan is pure for real: planning a run (a resumed one, in a cluster, with a user's
loader and builder) imports no TensorFlow or Keras, imports none of the user's code and
asks the network nothing. Each is refused in a child process, so the first touch fails the
plan with its name; the dry run's look-ups (`trainer.unresolved_peers`) and a user's code
(`prepare`) are named steps after it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.children import REPO

PLAN = """
import importlib.abc, json, socket, sys
from pathlib import Path

from mgpu_env.training.run.identity import identify
from mgpu_env.training.run.plan import plan_training
from tests.support.bundles import write_header_only_bundle
from tests.support.runtimes import runtime_of

settings = {"GPUS": "none", "DATASET": "user_loader:load", "MODEL": "user_model:build",
            "OUTPUT_DIR": OUTPUT, "EPOCHS": "3", "WORKER_HOSTS": "peer-a:2222,peer-b:2222",
            "WORKER_INDEX": "0"}
runtime = runtime_of(settings)
# A run folder that holds this run, checkpointed after epoch 2: the plan resumes it.
folder = Path(OUTPUT)
(folder / "checkpoints").mkdir(parents=True)
(folder / "run.json").write_text(json.dumps(
    {"schema_version": 1, "identity": identify(runtime, {}).values}))
(folder / "checkpoints" / "checkpoint").write_text(
    'model_checkpoint_path: "ckpt-2"\\nall_model_checkpoint_paths: "ckpt-2"\\n')
(folder / "history.json").write_text(json.dumps({"epochs": [{"epoch": 1}, {"epoch": 2}]}))
write_header_only_bundle(folder / "checkpoints" / "ckpt-2")

touched = []

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "tf_keras", "user_loader",
                                  "user_model"):
            touched.append(name)
            raise ImportError(f"the plan imported {name}")
        return None

def no_network(*args, **kwargs):
    touched.append(f"socket: {args[0]!r}")
    raise socket.gaierror(socket.EAI_NONAME, "the plan asked the network")

sys.meta_path.insert(0, Refuse())
socket.getaddrinfo = socket.gethostbyname = socket.gethostbyname_ex = no_network
before = set(sys.modules)
plan = plan_training(runtime, environ={})
print(json.dumps({
    "touched": touched,
    "loaded": sorted(m for m in set(sys.modules) - before
                     if m.split(".")[0] in ("tensorflow", "keras", "user_loader", "user_model")),
    "resume_epoch": plan.resume.epoch, "sizes": plan.sizes, "workers":
    plan.strategy_plan.role.num_workers, "notes": list(plan.notes),
}))
"""

USER_CODE = "raise SystemExit('user code was imported')\n"


def _plan_in_child(tmp_path: Path, script: str) -> dict[str, Any]:
    """Run a planning script in a child beside the user's modules; what it reports."""
    for name in ("user_loader", "user_model"):
        (tmp_path / f"{name}.py").write_text(USER_CODE)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{REPO}",
             "HOME": str(tmp_path)}, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_planning_a_resumed_cluster_run_touches_no_tensorflow_user_code_or_network(
    tmp_path: Path,
) -> None:
    found = _plan_in_child(tmp_path, f"OUTPUT = {str(tmp_path / 'run')!r}\n" + PLAN)
    assert found["touched"] == [] and found["loaded"] == [], found
    # It planned what was asked: a resume after epoch 2, a loader's sizes left to
    # `prepare`, two workers, and no note of peers (only a dry run looks them up).
    assert (found["resume_epoch"], found["sizes"], found["workers"]) == (2, None, 2)
    assert not any("resolve" in note for note in found["notes"]), found["notes"]


def test_the_refusals_would_catch_a_plan_that_touched_them(tmp_path: Path) -> None:
    """The check can fail: planning with the network refused and a real peer look-up
    (what the dry run adds) records the touch."""
    script = (f"OUTPUT = {str(tmp_path / 'run')!r}\n" + PLAN).replace(
        "plan = plan_training(runtime, environ={})",
        "from mgpu_env.training.run.trainer import unresolved_peers\n"
        "plan = plan_training(runtime, environ={}, looked_up=unresolved_peers(runtime))")
    found = _plan_in_child(tmp_path, script)
    assert any(touch.startswith("socket: 'peer-") for touch in found["touched"]), found
    assert any("peers that do not resolve yet: peer-b" in note for note in found["notes"]), found
