"""The KubeRay example in deploy/: what the project relies on, and valid core objects.

The RayCluster is a custom resource (checked field by field here); the core objects
(Deployment, Service, Secret, PersistentVolumeClaim) are validated against the Kubernetes
schemas shipped by kubernetes-validate. No cluster runs here: see docs/operations.md, "An
existing Ray cluster", for what stays unrun.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SECRET_NAME = "kappa-sweep-secrets"
SWEEP_ROOT = "/data/ksweep"
K8S_VERSION = "1.30.0"


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def by_kind() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in documents(path.name):
            if "kind" in doc and doc["kind"] != "Kustomization":
                assert doc["kind"] not in found, f"two {doc['kind']} objects"
                found[doc["kind"]] = doc
    return found


OBJECTS = by_kind()


def containers(pod_template: dict[str, Any]) -> list[dict[str, Any]]:
    return pod_template["spec"]["containers"]


def ray_pod_templates() -> dict[str, dict[str, Any]]:
    spec = OBJECTS["RayCluster"]["spec"]
    templates = {"head": spec["headGroupSpec"]["template"]}
    templates |= {g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]}
    return templates


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def secret_ref(value: Any) -> tuple[str, str] | None:
    ref = value.get("secretKeyRef") if isinstance(value, dict) else None
    return (ref["name"], ref["key"]) if ref else None


@pytest.mark.parametrize("kind", ["Deployment", "Service", "Secret", "PersistentVolumeClaim"])
def test_core_objects_are_valid_kubernetes(kind) -> None:
    kubernetes_validate.validate(OBJECTS[kind], K8S_VERSION, strict=True)


def test_validation_rejects_a_broken_object() -> None:
    broken = yaml.safe_load(yaml.safe_dump(OBJECTS["Deployment"]))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_api_and_every_ray_node_run_one_image() -> None:
    api = containers(OBJECTS["Deployment"]["spec"]["template"])
    images = {c["image"] for t in ray_pod_templates().values() for c in containers(t)}
    assert images == {c["image"] for c in api} and len(images) == 1
    kustomize = documents("kustomization.yaml")[0]
    assert [i["name"] for i in kustomize["images"]] == [images.pop().rsplit(":", 1)[0]]


def test_the_ray_version_is_the_image_pin() -> None:
    dockerfile = (ROOT / "docker" / "kappa-sweep" / "Dockerfile").read_text()
    pin = re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M).group(1)
    assert OBJECTS["RayCluster"]["spec"]["rayVersion"] == pin
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ray = next(Requirement(d) for d in deps if d.startswith("ray"))
    assert ray.specifier.contains(pin)


def test_the_api_submits_to_the_heads_jobs_api_with_the_token() -> None:
    api = containers(OBJECTS["Deployment"]["spec"]["template"])[0]
    env = env_of(api)
    cluster = OBJECTS["RayCluster"]["metadata"]["name"]
    head = containers(ray_pod_templates()["head"])[0]
    dashboard = next(p["containerPort"] for p in head["ports"] if p["name"] == "dashboard")
    assert env["KSWEEP_LAUNCHER"] == "ray"
    assert env["KSWEEP_RAY_JOBS_URL"] == f"http://{cluster}-head-svc:{dashboard}"
    assert OBJECTS["RayCluster"]["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert env["RAY_AUTH_MODE"] == "token"
    assert secret_ref(env["RAY_AUTH_TOKEN"]) == (SECRET_NAME, "ray-auth-token")


def test_every_ray_node_has_the_same_token_and_tracking_settings() -> None:
    api_env = env_of(containers(OBJECTS["Deployment"]["spec"]["template"])[0])
    for name, template in ray_pod_templates().items():
        env = env_of(containers(template)[0])
        assert env["RAY_AUTH_MODE"] == "token", name
        assert secret_ref(env["RAY_AUTH_TOKEN"]) == (SECRET_NAME, "ray-auth-token"), name
        assert env["MLFLOW_TRACKING_URI"] == api_env["MLFLOW_TRACKING_URI"], name
        assert env["KSWEEP_SWEEP_ROOT"] == api_env["KSWEEP_SWEEP_ROOT"] == SWEEP_ROOT, name


def test_ray_nodes_notice_a_lost_node_as_the_compose_cluster_does() -> None:
    """The node-death and liveness settings (docs/operations.md, "When a node fails"):
    the same on every KubeRay node as on the compose cluster's, where the smoke's faults run."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    wanted = {k: str(v) for k, v in compose["x-ray-node-environment"].items()
              if k.startswith(("RAY_health_check_", "RAY_raylet_liveness"))}
    assert len(wanted) == 5 and int(wanted["RAY_raylet_liveness_self_check_interval_ms"]) == 5000
    for name, template in ray_pod_templates().items():
        env = env_of(containers(template)[0])
        assert {k: env.get(k) for k in wanted} == wanted, name


def test_every_secret_reference_is_a_key_of_the_secret() -> None:
    keys = set(OBJECTS["Secret"]["stringData"])
    templates = [OBJECTS["Deployment"]["spec"]["template"], *ray_pod_templates().values()]
    refs = {secret_ref(v) for t in templates for c in containers(t) for v in env_of(c).values()}
    refs.discard(None)
    assert refs == {(SECRET_NAME, k) for k in keys}
    assert all("REPLACE" in v for v in OBJECTS["Secret"]["stringData"].values())


def test_sweep_root_is_one_shared_volume_on_every_pod() -> None:
    claim = OBJECTS["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    templates = [OBJECTS["Deployment"]["spec"]["template"], *ray_pod_templates().values()]
    for template in templates:
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in containers(template)[0]["volumeMounts"]}
        source = volumes[mounts[SWEEP_ROOT]]["persistentVolumeClaim"]["claimName"]
        assert source == claim["metadata"]["name"]
        # The image's user (uid 1000) must be able to write the volume.
        assert template["spec"]["securityContext"]["fsGroup"] == 1000


def test_api_ports_probes_and_environment_are_the_services() -> None:
    deployment = OBJECTS["Deployment"]
    api = containers(deployment["spec"]["template"])[0]
    env = env_of(api)
    port = next(p["containerPort"] for p in api["ports"] if p["name"] == "http")
    assert int(env["KSWEEP_PORT"]) == port
    assert {p["targetPort"] for p in OBJECTS["Service"]["spec"]["ports"]} == {"http"}
    assert OBJECTS["Service"]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert api["readinessProbe"]["httpGet"]["path"] == "/api/v1/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/api/v1/healthz"
    # Every KSWEEP_* variable is a setting, and the literal ones load.
    fields = {f"KSWEEP_{name.upper()}" for name in Settings.model_fields}
    assert {k for k in env if k.startswith("KSWEEP_")} <= fields
    literal = {k.removeprefix("KSWEEP_").lower(): v for k, v in env.items()
               if k.startswith("KSWEEP_") and isinstance(v, str)}
    settings = Settings(**literal)
    assert settings.launcher == "ray" and settings.port == port


def test_the_head_takes_no_trials_and_workers_have_a_cpu_limit() -> None:
    spec = OBJECTS["RayCluster"]["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in spec["workerGroupSpecs"]:
        limits = containers(group["template"])[0]["resources"]["limits"]
        assert "cpu" in limits and group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
