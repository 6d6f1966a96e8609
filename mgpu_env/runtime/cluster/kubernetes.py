"""The cluster of a Kubernetes Indexed Job with a headless Service (k8s/indexed-job.yaml).

No operator is needed: Kubernetes gives pod `i` the variable `JOB_COMPLETION_INDEX=i` and
the host name `<job>-<i>`, and the Service (the pods' `subdomain`) makes it reachable as
`<job>-<i>.<service>`. The manifest passes what Kubernetes does not: `K8S_JOB_NAME` (from
the pod's `batch.kubernetes.io/job-name` label), `K8S_SERVICE` and `K8S_WORKERS` (the
job's completions). Every pod listens on WORKER_PORT. Pod 0 is the chief.
"""

from __future__ import annotations

from collections.abc import Mapping

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.text import is_digits, plain, shown, whole_number
from mgpu_env.runtime.cluster.model import Cluster

INDEX = "JOB_COMPLETION_INDEX"
MANIFEST_VARIABLES = ("K8S_JOB_NAME", "K8S_SERVICE", "K8S_WORKERS")


def in_indexed_job(environ: Mapping[str, str]) -> bool:
    return INDEX in environ


def unused_index_note(environ: Mapping[str, str]) -> str | None:
    """An Indexed Job that does not describe an mgpu cluster is one process: said once."""
    if not in_indexed_job(environ) or any(k in environ for k in MANIFEST_VARIABLES):
        return None
    return (
        f"{INDEX}={environ[INDEX]} is set (a Kubernetes Indexed Job) but not "
        f"{', '.join(MANIFEST_VARIABLES)}: one process. For a multi-worker job start from "
        "k8s/indexed-job.yaml"
    )


def from_indexed_job(environ: Mapping[str, str], port: int) -> Cluster | None:
    if not in_indexed_job(environ) or not any(k in environ for k in MANIFEST_VARIABLES):
        return None
    missing = [k for k in MANIFEST_VARIABLES if not environ.get(k, "").strip()]
    if missing:
        raise ConfigError(
            f"This pod of a Kubernetes Indexed Job has {INDEX} but no {', '.join(missing)}.\n"
            "  Fix: set K8S_JOB_NAME (downward API, label batch.kubernetes.io/job-name), "
            "K8S_SERVICE (the headless Service, the pods' subdomain) and K8S_WORKERS (the "
            "job's completions) as k8s/indexed-job.yaml does."
        )
    index_text, workers_text = environ[INDEX].strip(), environ["K8S_WORKERS"].strip()
    count = whole_number(workers_text) if is_digits(workers_text) else None
    if count is None or count < 1:
        raise ConfigError(
            f"K8S_WORKERS={shown(workers_text)} is not a number of pods.\n"
            "  Valid: a whole number from 1, equal to the job's completions and parallelism."
            " Fix: set it to spec.completions."
        )
    workers = count
    index = whole_number(index_text) if is_digits(index_text) else None
    if index is None or index >= workers:
        raise ConfigError(
            f"{INDEX}={plain(index_text)} but K8S_WORKERS={workers}: the completion index "
            "must be "
            f"0..{workers - 1}.\n  Fix: keep K8S_WORKERS, spec.completions and "
            "spec.parallelism equal in the manifest."
        )
    if workers == 1:
        return None
    job, service = environ["K8S_JOB_NAME"].strip(), environ["K8S_SERVICE"].strip()
    addresses = tuple(f"{job}-{i}.{service}:{port}" for i in range(workers))
    return Cluster({"worker": addresses}, "worker", index, "kubernetes")
