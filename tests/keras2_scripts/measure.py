"""The corpus under `mgpu run` with KERAS=auto: what each script did, and what mgpu said.

    .venv/bin/python -m tests.keras2_scripts.measure [--repo PATH] [NAME...]   # repo root

Each script of tests/support/corpus.py's SCRIPTS runs once, in turn, on 2 logical CPUs
with its stand-in data (as the test runs it), and one line says:
- what it did: `trained` (exit 0), `told` (failed, and mgpu's last line gives the KERAS=2
  command), `bare` (failed without that line);
- whether tf_keras was chosen before its first step (`keras 2 at start`: the source scan);
- the replicas: planned (the start summary), in sync in the strategy the script built (mgpu's
  end line: observed at its first step; 1 for TensorFlow's default strategy or no strategy),
  and what the script printed of it itself ("Number of devices: 2"), if it does.
`--repo` runs another checkout's mgpu (a worktree of an earlier commit: the "before").
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from tests.support.corpus import RERUN_MARK, SCRIPTS, Script, run_script

PLANNED = re.compile(r"(\d+) replica\(s\) \(")
IN_SYNC = re.compile(r"strategy that ran: (.*?), (\d+) replicas? in sync|strategy that ran: "
                     r"(TensorFlow's default|none)")
SCRIPT_SAYS = re.compile(r"(?:Number of devices|num_replicas_in_sync|Number of replicas)"
                         r"\W+(\d+)", re.IGNORECASE)


def measure(script: Script, folder: Path) -> dict[str, object]:
    started = time.perf_counter()
    result = run_script(folder, script)
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    outcome = "trained" if result.returncode == 0 else (
        "told" if RERUN_MARK in last else "bare")
    planned = PLANNED.search(result.stderr)
    ran = IN_SYNC.search(result.stderr)
    says = SCRIPT_SAYS.findall(result.stdout)
    return {
        "script": script.name, "outcome": outcome, "exit": result.returncode,
        "keras_2_at_start": "KERAS=auto: the script uses what only Keras 2 has"
                            in result.stderr,
        "planned": int(planned.group(1)) if planned else None,
        "strategy": (ran.group(1) or ran.group(3)) if ran else None,
        "in_sync": int(ran.group(2)) if ran and ran.group(2) else (1 if ran else None),
        "script_says": sorted(set(says)),
        "warnings": [line for line in result.stderr.splitlines()
                     if line.startswith("mgpu run: warning:")],
        "seconds": round(time.perf_counter() - started),
        "last": last[:300],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", help="another checkout whose mgpu to run")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    if args.repo:
        import tests.support.corpus as corpus

        corpus.OFFLINE = corpus.OFFLINE.replace(str(corpus.REPO), args.repo)
    chosen = [s for s in SCRIPTS if not args.names or s.name in args.names]
    counts: dict[str, int] = {}
    for script in chosen:
        with tempfile.TemporaryDirectory() as folder:
            row = measure(script, Path(folder))
        counts[str(row["outcome"])] = counts.get(str(row["outcome"]), 0) + 1
        print(row, flush=True)
    print(f"TOTAL {counts} of {len(chosen)}", file=sys.stderr)


if __name__ == "__main__":
    main()
