"""The manifests in k8s/, checked offline as a cluster would check them.

- Built-in kinds (Job, Service, PersistentVolumeClaim, Pod) against Kubernetes' own schemas,
  bundled with kubernetes-validate, in strict mode: an unknown field is refused.
- The TFJob against its operator's CRD (k8s/schemas/), made strict as kubeconform makes it,
  and against the rules the operator's admission webhook adds.
- Every pod template of every manifest against the restricted Pod Security Standard.
- The Indexed Job's numbers, names and ports agree with each other and with its Service.

Every check is also fed mutated copies that it must refuse, so none can pass vacuously.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.children import REPO as ROOT

K8S = ROOT / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
TFJOB_CRD = K8S / "schemas" / "kubeflow.org_tfjobs.yaml"
# Where the project's shared folder keeps the CRD the copy above was taken from (beside the
# repository, in a checkout and in CI alike).
SHARED_TFJOB_CRD = ROOT.parent / "shared" / "k8s" / "kubeflow.org_tfjobs.yaml"

# The oldest Kubernetes the Indexed Job needs (backoffLimitPerIndex is GA from 1.33) and the
# newest kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")

Doc = dict[str, Any]
Mutation = Callable[[Doc], object]
# Changes the Indexed Job's [Job, Service, claim] in place.
DocsMutation = Callable[[list[Doc]], object]


def load_documents(path: Path) -> list[Doc]:
    """Every non-empty document of a YAML file; anchors and aliases resolved."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(path.read_text(), Loader=loader) if doc]


def documents() -> Iterator[tuple[str, Doc]]:
    for path in MANIFESTS:
        for doc in load_documents(path):
            yield f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc


def mutated(doc: Doc, mutation: Mutation) -> Doc:
    """A deep copy of `doc` changed by `mutation` (which changes its argument in place)."""
    copied = copy.deepcopy(doc)
    mutation(copied)
    return copied


def document(file: str, kind: str) -> Doc:
    [doc] = [d for d in load_documents(K8S / file) if d["kind"] == kind]
    return doc


# --- Built-in kinds: Kubernetes' own schemas --------------------------------------------------

def job_container(job: Doc) -> Doc:
    container: Doc = job["spec"]["template"]["spec"]["containers"][0]
    return container


def kubernetes_errors(doc: Doc, version: str) -> list[str]:
    """What the API server's schema for `version` refuses in `doc` (unknown fields too)."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path))}: {error.message}"]
    return []


def is_tfjob(doc: Doc) -> bool:
    return doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "TFJob"


BUILT_IN = [(where, doc) for where, doc in documents() if not is_tfjob(doc)]


def test_the_manifests_hold_what_the_docs_describe() -> None:
    kinds = {where.split(":")[1] for where, _ in documents()}
    assert {"Job/mgpu-train", "Service/mgpu-workers", "TFJob/mgpu-train",
            "PersistentVolumeClaim/mgpu-runs", "Pod/mgpu-runs-reader"} <= kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("where", "doc"), BUILT_IN, ids=[w for w, _ in BUILT_IN])
def test_built_in_kinds_meet_kubernetes_schema(where: str, doc: Doc, version: str) -> None:
    assert kubernetes_errors(doc, version) == []


@pytest.mark.parametrize(("where", "doc"), BUILT_IN, ids=[w for w, _ in BUILT_IN])
def test_kubernetes_schema_refuses_an_unknown_field(where: str, doc: Doc) -> None:
    broken = mutated(doc, lambda d: d["spec"].update(unknownField=1))
    assert "unknownField" in " ".join(kubernetes_errors(broken, KUBERNETES_VERSIONS[0]))


def test_kubernetes_schema_refuses_deep_unknown_fields_and_wrong_types() -> None:
    job = document("indexed-job.yaml", "Job")
    container = job_container
    for mutation in (
        lambda d: container(d).update(imagePullPolicyy="Always"),
        lambda d: container(d)["securityContext"].update(dropAll=True),
        lambda d: d["spec"]["podFailurePolicy"]["rules"][0].update(exitCodes=[2]),
        lambda d: d["spec"].update(completions="two"),
        lambda d: container(d).pop("name"),
    ):
        assert kubernetes_errors(mutated(job, mutation), KUBERNETES_VERSIONS[0])


# --- The TFJob: its CRD's schema and its webhook's rules ---------------------------------------

def strict(schema: Doc) -> Doc:
    """A copy of a CRD's OpenAPI v3 schema that refuses unknown fields, as kubeconform's
    openapi2jsonschema makes it: every object schema that lists `properties` and says nothing
    of `additionalProperties` gets `additionalProperties: false`, unless it keeps unknown
    fields (`x-kubernetes-preserve-unknown-fields`); an int-or-string takes either type."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if ("additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    for key in ("additionalProperties", "items", "not"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            schema[key] = [strict(sub) for sub in schema[key]]
    if schema.get("x-kubernetes-int-or-string") and not {"type", "anyOf", "oneOf"} & set(schema):
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return schema


@cache
def tfjob_schema() -> Doc:
    """The CRD's schema for kubeflow.org/v1 TFJob, as the API server stores it."""
    [crd] = load_documents(TFJOB_CRD)
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: Doc = version["schema"]["openAPIV3Schema"]
    return schema


@cache
def strict_tfjob_validator() -> jsonschema.Draft4Validator:
    # Draft 4: the JSON Schema dialect OpenAPI v3.0 (and so a CRD) is written in.
    return jsonschema.Draft4Validator(strict(tfjob_schema()))


def tfjob_schema_errors(doc: Doc, validator: jsonschema.Draft4Validator | None = None) -> list[str]:
    errors = (validator or strict_tfjob_validator()).iter_errors(doc)
    return sorted(f"{error.json_path}: {error.message}" for error in errors)


DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def tfjob_webhook_errors(doc: Doc) -> list[str]:
    """The training operator's admission webhook (pkg/webhooks/tensorflow/tfjob_webhook.go,
    release-1.9): the name is a DNS-1035 label; every replica has a container named
    `tensorflow` and every container an image; at most one Chief or Master replica."""
    errors = []
    name = doc.get("metadata", {}).get("name", "")
    if len(name) > 63 or not DNS_1035_LABEL.fullmatch(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    replicas = doc.get("spec", {}).get("tfReplicaSpecs") or {}
    if not replicas:
        errors.append("spec.tfReplicaSpecs: must be given")
    for kind, replica in replicas.items():
        containers = (replica or {}).get("template", {}).get("spec", {}).get("containers") or []
        where = f"spec.tfReplicaSpecs.{kind}.template.spec.containers"
        if not containers:
            errors.append(f"{where}: must be given")
        errors += [f"{where}[{i}].image: must be given"
                   for i, container in enumerate(containers) if not container.get("image")]
        if not any(container.get("name") == "tensorflow" for container in containers):
            errors.append(f"{where}: needs a container named tensorflow")
    chiefs = [kind for kind in replicas if kind.lower() in ("chief", "master")]
    if len(chiefs) > 1:
        errors.append(f"spec.tfReplicaSpecs: more than one Chief or Master: {chiefs}")
    return errors


def test_the_crd_is_the_shared_one() -> None:
    """k8s/schemas/ holds the shared folder's CRD unchanged, below a header naming its source."""
    if not SHARED_TFJOB_CRD.is_file():
        pytest.skip(f"no shared folder beside the repository ({SHARED_TFJOB_CRD})")
    vendored = TFJOB_CRD.read_text()
    header = "".join(line for line in vendored.splitlines(keepends=True) if line.startswith("#"))
    assert "kubeflow/trainer" in header and "release-1.9" in header
    assert vendored.removeprefix(header) == SHARED_TFJOB_CRD.read_text()


def test_the_tfjob_meets_its_crd_and_its_webhook() -> None:
    tfjob = document("tfjob.yaml", "TFJob")
    assert tfjob_schema_errors(tfjob) == []
    assert tfjob_webhook_errors(tfjob) == []


def chief_container(doc: Doc) -> Doc:
    container: Doc = doc["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
    return container


SCHEMA_MUTATIONS: dict[str, Mutation] = {
    "unknown top-level field": lambda d: d.update(status2={}),
    "unknown spec field": lambda d: d["spec"].update(tfReplicaSpec={}),
    "unknown runPolicy field": lambda d: d["spec"]["runPolicy"].update(backoffLimits=3),
    "unknown replica field": lambda d: d["spec"]["tfReplicaSpecs"]["Chief"].update(replica=1),
    "unknown container field": lambda d: chief_container(d).update(imagePullPolicyy="Always"),
    "unknown securityContext field": lambda d: chief_container(d)["securityContext"].update(
        dropAll=True),
    "replicas not a number": lambda d: d["spec"]["tfReplicaSpecs"]["Chief"].update(
        replicas="one"),
    "container without a name": lambda d: chief_container(d).pop("name"),
    "GPU limit not a quantity": lambda d: chief_container(d)["resources"]["limits"].update(
        {"nvidia.com/gpu": [1]}),
}


@pytest.mark.parametrize("mutation", SCHEMA_MUTATIONS.values(), ids=SCHEMA_MUTATIONS.keys())
def test_the_strict_crd_schema_refuses(mutation: Mutation) -> None:
    assert tfjob_schema_errors(mutated(document("tfjob.yaml", "TFJob"), mutation))


def test_the_crd_as_shipped_lets_unknown_fields_through() -> None:
    """Why strict() exists: the CRD itself does not refuse an unknown field."""
    broken = mutated(document("tfjob.yaml", "TFJob"), SCHEMA_MUTATIONS["unknown container field"])
    assert tfjob_schema_errors(broken, jsonschema.Draft4Validator(tfjob_schema())) == []


def test_strict_keeps_open_what_kubernetes_keeps_open() -> None:
    schema = strict({"type": "object", "properties": {
        "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
        "preserved": {"type": "object", "properties": {"a": {"type": "string"}},
                      "x-kubernetes-preserve-unknown-fields": True},
        "map": {"type": "object", "additionalProperties": {"type": "string"}},
        "quantity": {"x-kubernetes-int-or-string": True,
                     "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "port": {"x-kubernetes-int-or-string": True},
    }})
    validator = jsonschema.Draft4Validator(schema)
    assert validator.is_valid({"preserved": {"a": "x", "b": 1}, "map": {"any": "x"},
                               "quantity": 1, "port": "http"})
    assert validator.is_valid({"quantity": "500m", "port": 2222})
    assert not validator.is_valid({"closed": {"a": "x", "b": 1}})
    assert not validator.is_valid({"map": {"any": 1}})
    assert not validator.is_valid({"other": 1})
    assert not validator.is_valid({"quantity": 1.5})
    assert not validator.is_valid({"port": {"a": 1}})


def second_chief(kind: str) -> Mutation:
    return lambda d: d["spec"]["tfReplicaSpecs"].update(
        {kind: copy.deepcopy(d["spec"]["tfReplicaSpecs"]["Chief"])})


WEBHOOK_MUTATIONS: dict[str, Mutation] = {
    "name with capitals": lambda d: d["metadata"].update(name="MGPU-train"),
    "name with a dot": lambda d: d["metadata"].update(name="mgpu.train"),
    "name starting with a digit": lambda d: d["metadata"].update(name="1-mgpu"),
    "name of 64 characters": lambda d: d["metadata"].update(name="m" * 64),
    "no tensorflow container": lambda d: chief_container(d).update(name="trainer"),
    "a container without an image": lambda d: chief_container(d).pop("image"),
    "a container with an empty image": lambda d: chief_container(d).update(image=""),
    "a replica without containers": lambda d: d["spec"]["tfReplicaSpecs"]["Chief"]["template"][
        "spec"].update(containers=[]),
    "a Master beside the Chief": second_chief("Master"),
    "no replicas": lambda d: d["spec"].update(tfReplicaSpecs={}),
}


@pytest.mark.parametrize("mutation", WEBHOOK_MUTATIONS.values(), ids=WEBHOOK_MUTATIONS.keys())
def test_the_webhook_rules_refuse(mutation: Mutation) -> None:
    assert tfjob_webhook_errors(mutated(document("tfjob.yaml", "TFJob"), mutation))


# --- The restricted Pod Security Standard, every pod template ----------------------------------
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (restricted includes
# baseline). GPUs come from the device plugin and need none of what it forbids.

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
KINDS_WITHOUT_PODS = {"Service", "PersistentVolumeClaim", "ConfigMap", "Secret"}


def pod_templates(doc: Doc) -> dict[str, Doc]:
    """Every pod template in a manifest ({"metadata": ..., "spec": PodSpec}), by where it is."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Pod":
        return {"": doc}
    if kind in {"Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"}:
        return {"spec.template": spec["template"]}
    if kind == "CronJob":
        return {"spec.jobTemplate.spec.template": spec["jobTemplate"]["spec"]["template"]}
    if is_tfjob(doc):
        return {f"spec.tfReplicaSpecs.{replica}.template": each["template"]
                for replica, each in spec["tfReplicaSpecs"].items()}
    assert kind in KINDS_WITHOUT_PODS, f"{kind}: say where its pod templates are"
    return {}


TEMPLATES = [(f"{where}:{path}", template) for where, doc in documents()
             for path, template in pod_templates(doc).items()]


def security_violations(template: Doc) -> list[str]:
    """What the restricted Pod Security Standard refuses in a pod template."""
    pod = template.get("spec", {})
    pod_security = pod.get("securityContext") or {}
    containers = [(f"{field}[{c.get('name')}]", c, c.get("securityContext") or {})
                  for field in ("initContainers", "containers", "ephemeralContainers")
                  for c in pod.get(field) or []]
    errors = [f"{name}: must not be true" for name in ("hostNetwork", "hostPID", "hostIPC")
              if pod.get(name)]
    errors += [f"volume {v.get('name')}: type not allowed" for v in pod.get("volumes") or []
               if set(v) - {"name"} - RESTRICTED_VOLUMES]
    errors += [f"sysctl {s.get('name')}: not a safe sysctl"
               for s in pod_security.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    annotations = template.get("metadata", {}).get("annotations") or {}
    errors += [f"annotation {key}: AppArmor unconfined" for key, value in annotations.items()
               if key.startswith("container.apparmor.security.beta.kubernetes.io/")
               and not (value == "runtime/default" or value.startswith("localhost/"))]
    for where, context in [("pod", pod_security), *[(w, s) for w, _, s in containers]]:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            errors.append(f"{where}: hostProcess")
        if context.get("runAsUser") == 0:
            errors.append(f"{where}: runAsUser 0")
        if context.get("runAsNonRoot") is False:
            errors.append(f"{where}: runAsNonRoot false")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
            errors.append(f"{where}: seccompProfile {seccomp}")
        apparmor = (context.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in ("RuntimeDefault", "Localhost"):
            errors.append(f"{where}: appArmorProfile {apparmor}")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get(
                "role"):
            errors.append(f"{where}: seLinuxOptions {selinux}")
    if not pod_security.get("runAsNonRoot") and not all(
            s.get("runAsNonRoot") for _, _, s in containers):
        errors.append("runAsNonRoot: true on the pod or on every container")
    if not pod_security.get("seccompProfile") and not all(
            s.get("seccompProfile") for _, _, s in containers):
        errors.append("seccompProfile: RuntimeDefault or Localhost on the pod or every container")
    for where, container, context in containers:
        if context.get("privileged"):
            errors.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            errors.append(f"{where}: capabilities must drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            errors.append(f"{where}: adds capabilities {capabilities['add']}")
        if context.get("procMount", "Default") != "Default":
            errors.append(f"{where}: procMount {context['procMount']}")
        errors += [f"{where}: hostPort {port['hostPort']}"
                   for port in container.get("ports") or [] if port.get("hostPort")]
    return errors


def house_security_violations(template: Doc) -> list[str]:
    """This project's own choice within the standard: the pod as the image's user (1000),
    decided once on the pod, and the group that can write every claim it mounts."""
    pod = template["spec"]
    context = pod.get("securityContext") or {}
    errors = [f"pod securityContext.{key} must be {value!r}" for key, value in {
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"}}.items() if context.get(key) != value]
    claims = {v["name"] for v in pod.get("volumes") or [] if "persistentVolumeClaim" in v
              and not v["persistentVolumeClaim"].get("readOnly")}
    if claims and context.get("fsGroup") != 1000:
        errors.append(f"claims {sorted(claims)} are written: fsGroup must be 1000")
    return errors


def test_every_pod_template_is_found() -> None:
    assert len(TEMPLATES) == 4, [where for where, _ in TEMPLATES]


@pytest.mark.parametrize(("where", "template"), TEMPLATES, ids=[w for w, _ in TEMPLATES])
def test_pod_templates_meet_the_restricted_standard(where: str, template: Doc) -> None:
    assert security_violations(template) == []
    assert house_security_violations(template) == []


def first_container(template: Doc) -> Doc:
    container: Doc = template["spec"]["containers"][0]
    return container


def pod_security(template: Doc) -> Doc:
    context: Doc = template["spec"]["securityContext"]
    return context


SECURITY_MUTATIONS: dict[str, Mutation] = {
    "runAsNonRoot removed": lambda t: pod_security(t).pop("runAsNonRoot"),
    "runAsNonRoot false on a container": lambda t: first_container(t)["securityContext"].update(
        runAsNonRoot=False),
    "root user on a container": lambda t: first_container(t)["securityContext"].update(
        runAsUser=0),
    "seccomp removed": lambda t: pod_security(t).pop("seccompProfile"),
    "seccomp unconfined": lambda t: pod_security(t).update(
        seccompProfile={"type": "Unconfined"}),
    "privilege escalation allowed": lambda t: first_container(t)["securityContext"].update(
        allowPrivilegeEscalation=True),
    "privilege escalation unset": lambda t: first_container(t)["securityContext"].pop(
        "allowPrivilegeEscalation"),
    "capabilities kept": lambda t: first_container(t)["securityContext"].pop("capabilities"),
    "a capability added": lambda t: first_container(t)["securityContext"]["capabilities"].update(
        add=["SYS_ADMIN"]),
    "privileged": lambda t: first_container(t)["securityContext"].update(privileged=True),
    "host network": lambda t: t["spec"].update(hostNetwork=True),
    "host IPC": lambda t: t["spec"].update(hostIPC=True),
    "hostPath volume": lambda t: t["spec"].setdefault("volumes", []).append(
        {"name": "dev", "hostPath": {"path": "/dev"}}),
    "host port": lambda t: first_container(t).setdefault("ports", []).append(
        {"containerPort": 9999, "hostPort": 9999}),
    "unsafe sysctl": lambda t: pod_security(t).update(
        sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
    "AppArmor unconfined": lambda t: pod_security(t).update(
        appArmorProfile={"type": "Unconfined"}),
    "SELinux user": lambda t: pod_security(t).update(seLinuxOptions={"user": "system_u"}),
    "unmasked /proc": lambda t: first_container(t)["securityContext"].update(
        procMount="Unmasked"),
    "an init container without a securityContext": lambda t: t["spec"].update(
        initContainers=[{"name": "init", "image": "busybox"}]),
}
HOUSE_MUTATIONS: dict[str, Mutation] = {
    "runAsNonRoot only on the containers": lambda t: [pod_security(t).pop("runAsNonRoot"), *[
        c.setdefault("securityContext", {}).update(runAsNonRoot=True)
        for c in t["spec"]["containers"]]],
    "another user": lambda t: pod_security(t).update(runAsUser=1001),
    "no group": lambda t: pod_security(t).pop("runAsGroup"),
    "a written claim without fsGroup": lambda t: [pod_security(t).pop("fsGroup", None),
                                                  t["spec"].setdefault("volumes", []).append(
        {"name": "more", "persistentVolumeClaim": {"claimName": "more"}})],
}


@pytest.mark.parametrize("mutation", SECURITY_MUTATIONS.values(), ids=SECURITY_MUTATIONS.keys())
@pytest.mark.parametrize(("where", "template"), TEMPLATES, ids=[w for w, _ in TEMPLATES])
def test_the_restricted_standard_refuses(where: str, template: Doc, mutation: Mutation) -> None:
    assert security_violations(mutated(template, mutation))


@pytest.mark.parametrize("mutation", HOUSE_MUTATIONS.values(), ids=HOUSE_MUTATIONS.keys())
@pytest.mark.parametrize(("where", "template"), TEMPLATES, ids=[w for w, _ in TEMPLATES])
def test_the_house_settings_refuse(where: str, template: Doc, mutation: Mutation) -> None:
    assert house_security_violations(mutated(template, mutation))


# --- The Indexed Job and its Service agree ----------------------------------------------------

JOB_NAME_FIELD = "metadata.labels['batch.kubernetes.io/job-name']"


def env_values(container: Doc) -> dict[str, Any]:
    """Each variable's value, or for one from the downward API its field path."""
    return {e["name"]: e["value"] if "value" in e else e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in container.get("env") or []}


def indexed_job_errors(job: Doc, service: Doc, claim: Doc) -> list[str]:
    """Where the Indexed Job, its headless Service and the runs claim disagree."""
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = env_values(container)
    errors = []
    if spec.get("completionMode") != "Indexed":
        errors.append("completionMode must be Indexed")
    if not spec.get("completions") == spec.get("parallelism") == int(env.get("K8S_WORKERS", -1)):
        errors.append("completions, parallelism and K8S_WORKERS must be equal")
    if "JOB_COMPLETION_INDEX" in env:
        errors.append("JOB_COMPLETION_INDEX is Kubernetes' to set")
    if env.get("K8S_JOB_NAME") != JOB_NAME_FIELD:
        errors.append(f"K8S_JOB_NAME must come from {JOB_NAME_FIELD}")
    # The Job controller labels its pods with the Job's name, besides the template's labels.
    labels = {**job["spec"]["template"].get("metadata", {}).get("labels", {}),
              "batch.kubernetes.io/job-name": job["metadata"]["name"]}
    selector = service["spec"].get("selector") or {}
    if not selector or any(labels.get(key) != value for key, value in selector.items()):
        errors.append(f"the Service selects {selector}, the pods have {labels}")
    if service["spec"].get("clusterIP") != "None":
        errors.append("the Service must be headless (clusterIP: None)")
    if not pod.get("subdomain") == service["metadata"]["name"] == env.get("K8S_SERVICE"):
        errors.append("subdomain, the Service's name and K8S_SERVICE must be equal")
    ports = {str(p["containerPort"]) for p in container.get("ports") or []}
    ports |= {str(p[key]) for p in service["spec"]["ports"] for key in ("port", "targetPort")
              if key in p}
    if ports != {env.get("WORKER_PORT")}:
        errors.append(f"containerPort and the Service's ports {sorted(ports)} and WORKER_PORT "
                      f"{env.get('WORKER_PORT')!r} must be equal")
    mounted = {v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes") or []
               if "persistentVolumeClaim" in v}
    if mounted != {claim["metadata"]["name"]}:
        errors.append(f"the pods mount {mounted}, the manifest makes {claim['metadata']['name']}")
    if "ReadWriteMany" not in claim["spec"]["accessModes"]:
        errors.append("every pod mounts the claim: it must be ReadWriteMany")
    return errors


def indexed_job() -> tuple[Doc, Doc, Doc]:
    docs = {doc["kind"]: doc for doc in load_documents(K8S / "indexed-job.yaml")}
    return docs["Job"], docs["Service"], docs["PersistentVolumeClaim"]


def test_the_indexed_job_agrees_with_its_service() -> None:
    assert indexed_job_errors(*indexed_job()) == []


def test_the_indexed_job_runs_mgpu_as_the_tfjob_does() -> None:
    from mgpu_env.config.settings import BY_ENV

    job, _, _ = indexed_job()
    [container] = job["spec"]["template"]["spec"]["containers"]
    [tfjob_chief] = document("tfjob.yaml", "TFJob")["spec"]["tfReplicaSpecs"]["Chief"][
        "template"]["spec"]["containers"]
    cluster = {"K8S_JOB_NAME", "K8S_SERVICE", "K8S_WORKERS", "WORKER_PORT"}
    env = env_values(container)
    assert set(env) >= cluster
    run_settings = {name: value for name, value in env.items() if name not in cluster}
    assert run_settings == env_values(tfjob_chief) and set(run_settings) <= set(BY_ENV)
    assert (container["image"], container["args"]) == (tfjob_chief["image"], ["train"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes[mounts["/workspace/runs"]]


def service_port(value: int) -> DocsMutation:
    return lambda docs: docs[1]["spec"]["ports"][0].update(port=value)


def job_env(name: str, value: str) -> DocsMutation:
    def change(docs: list[Doc]) -> None:
        [variable] = [e for e in job_container(docs[0])["env"] if e["name"] == name]
        variable.pop("valueFrom", None)
        variable["value"] = value
    return change


CONSISTENCY_MUTATIONS: dict[str, DocsMutation] = {
    "completions alone": lambda docs: docs[0]["spec"].update(completions=3),
    "parallelism alone": lambda docs: docs[0]["spec"].update(parallelism=3),
    "K8S_WORKERS alone": job_env("K8S_WORKERS", "3"),
    "not indexed": lambda docs: docs[0]["spec"].update(completionMode="NonIndexed"),
    "JOB_COMPLETION_INDEX set": lambda docs: job_container(docs[0])["env"].append(
        {"name": "JOB_COMPLETION_INDEX", "value": "0"}),
    "K8S_JOB_NAME typed in": job_env("K8S_JOB_NAME", "mgpu-train"),
    "the Job renamed": lambda docs: docs[0]["metadata"].update(name="mgpu-train2"),
    "the selector on another label": lambda docs: docs[1]["spec"].update(
        selector={"app": "mgpu"}),
    "no selector": lambda docs: docs[1]["spec"].pop("selector"),
    "a Service with an address": lambda docs: docs[1]["spec"].pop("clusterIP"),
    "the Service renamed": lambda docs: docs[1]["metadata"].update(name="workers"),
    "the subdomain alone": lambda docs: docs[0]["spec"]["template"]["spec"].update(
        subdomain="workers"),
    "K8S_SERVICE alone": job_env("K8S_SERVICE", "workers"),
    "the Service's port": service_port(2223),
    "the Service's targetPort": lambda docs: docs[1]["spec"]["ports"][0].update(targetPort=2223),
    "the containerPort": lambda docs: job_container(docs[0])["ports"][0].update(
        containerPort=2223),
    "WORKER_PORT alone": job_env("WORKER_PORT", "2223"),
    "another claim": lambda docs: docs[2]["metadata"].update(name="runs"),
    "a ReadWriteOnce claim": lambda docs: docs[2]["spec"].update(accessModes=["ReadWriteOnce"]),
}


@pytest.mark.parametrize("mutation", CONSISTENCY_MUTATIONS.values(),
                         ids=CONSISTENCY_MUTATIONS.keys())
def test_the_consistency_check_refuses(mutation: DocsMutation) -> None:
    docs = copy.deepcopy(list(indexed_job()))
    mutation(docs)
    assert indexed_job_errors(*docs)
