"""Under the test Slurm (tests/slurm/start-slurm.sh): seconds from `srun` to the first
training step for 1 task vs 2, and for the survivor to stop after one task is killed.

    .venv/bin/python benchmarks/slurm_startup.py --repeats 3

The first step: `mgpu run` of a script whose first all-reduce prints the wall clock; the
kill: `srun -n2 mgpu train` (digits, CPU) until epoch 1 is checkpointed, then SIGKILL to
task 1 and the time until srun returns (task 0 stopped, naming worker 1). As root only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.slurm.test_slurm import free_port_pair
from tests.support.children import REPO
from tests.support.runfolders import completed_epochs
from tests.support.slurm_cluster import start_cluster

FIRST_STEP = '''
import time, tensorflow as tf, mgpu_env
strategy = mgpu_env.strategy()
step = tf.function(lambda: strategy.run(
    lambda: tf.distribute.get_replica_context().all_reduce("sum", 1.0)))
step()
print(f"FIRST_STEP {time.time():.3f}", flush=True)
'''


def settings(folder: Path) -> dict[str, str]:
    return {"PATH": f"{REPO / '.venv' / 'bin'}:/usr/bin:/bin:/usr/sbin:/sbin",
            "GPUS": "none", "DATASET": "digits", "BATCH_SIZE": "16", "QUIET": "1",
            "WORKER_TIMEOUT": "30", "WORKER_PORT": str(free_port_pair()),
            "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": str(folder / "home")}


def to_first_step(cluster, tasks: int) -> float:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "step.py").write_text(FIRST_STEP)
        started = time.time()
        subprocess.run(["srun", f"-n{tasks}", f"--output={folder}/task-%t.log", "mgpu", "run",
                        "step.py"], env=cluster.env(settings(folder)), cwd=folder,
                       check=True, timeout=600)
        stamps = [float(line.split()[1]) for t in range(tasks)
                  for line in (folder / f"task-{t}.log").read_text().splitlines()
                  if line.startswith("FIRST_STEP")]
        assert len(stamps) == tasks, "a task printed no first step"
        return max(stamps) - started


def survivor_stop(cluster) -> float:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        step = subprocess.Popen(
            ["srun", "-n2", "--kill-on-bad-exit=0", f"--output={folder}/task-%t.log", "bash",
             "-c", f"echo $$ > pid.$SLURM_PROCID; OUTPUT_DIR={folder}/out$SLURM_PROCID "
             "EPOCHS=100 exec mgpu train"],
            env=cluster.env(settings(folder)), cwd=folder, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        while completed_epochs(folder / "out0") < 1:
            assert step.poll() is None, (folder / "task-0.log").read_text()
            time.sleep(0.05)
        subprocess.run(["kill", "-9", (folder / "pid.1").read_text().strip()], check=True)
        killed = time.monotonic()
        step.wait(timeout=120)
        took = time.monotonic() - killed
        assert "Worker 1 stopped or cannot be reached" in (folder / "task-0.log").read_text()
        return took


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}..{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cluster = start_cluster()
    print(f"Slurm ready in {cluster.start_seconds:.2f} s "
          f"({'started' if cluster.started_here else 'already running'})")
    one: list[float] = []
    two: list[float] = []
    for _ in range(args.repeats):  # alternating, so a busy moment hits both alike
        one.append(to_first_step(cluster, 1))
        two.append(to_first_step(cluster, 2))
    kills = [survivor_stop(cluster) for _ in range(args.repeats)]
    print(f"seconds, median (min..max) of {args.repeats}; GPUS=none, {cluster.conf}")
    print(f"srun -n1 mgpu run: srun to the first step      {summary(one)}")
    print(f"srun -n2 mgpu run: srun to both first steps    {summary(two)}")
    print(f"srun -n2 mgpu train, task 1 killed: to srun's exit {summary(kills)}")
    cluster.stop()


if __name__ == "__main__":
    main()
