"""The Kubernetes manifests (``deploy/kubernetes``): valid offline against a current Kubernetes
(kubernetes-validate, strict), consistent with each other, and naming only probe paths and
metrics the real server serves."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from batching.keys import ApiKeys
from batching.models.engines.engine_options import default_cache_dir
from batching.settings.cli import build_parser
from batching.settings.serving import DEFAULT_GRPC_PORT
from tests.support.asgi import app_with, serving
from tests.support.manifests import (
    KUBERNETES,
    NAMESPACE,
    documents,
    images,
    manifest_files,
    metric_names,
    of_kind,
    pod_templates,
    probe_paths,
    promql_queries,
    restricted_violations,
)
from tests.support.models import EchoModel

#: Kinds Kubernetes' own schemas do not cover: checked by hand below.
NOT_KUBERNETES = {"Kustomization", "ScaledObject"}
VERSION = kubernetes_validate.latest_version()


def test_a_current_kubernetes_version_is_validated_against() -> None:
    major, minor = (int(part) for part in VERSION.split(".")[:2])
    assert (major, minor) >= (1, 33)


@pytest.mark.parametrize(
    "path,document",
    [(path, document) for path, document in documents() if document["kind"] not in NOT_KUBERNETES],
    ids=lambda value: value.name if isinstance(value, Path) else "",
)
def test_each_manifest_is_valid_in_strict_mode(path: Path, document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, VERSION, strict=True)


def test_the_kinds_without_a_schema_are_the_expected_ones() -> None:
    for _, document in documents():
        if document["kind"] in NOT_KUBERNETES:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(document, VERSION, strict=True)


def test_every_kustomization_lists_existing_files_and_every_file_is_used() -> None:
    used: set[Path] = set()
    for path in sorted(KUBERNETES.rglob("kustomization.yaml")):
        document = yaml.safe_load(path.read_text())
        assert document["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
        assert set(document) <= {"apiVersion", "kind", "namespace", "resources"}, path
        assert document["namespace"] == NAMESPACE
        used.add(path)
        for resource in document["resources"]:
            target = (path.parent / resource).resolve()
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), (path, resource)
            else:
                assert target.is_file(), (path, resource)
                used.add(target)
    assert set(manifest_files()) == used


def test_the_deployment_probes_resources_and_drain() -> None:
    (deployment,) = of_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # load + warm-up
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]
    # The CPU budget comes from the container: no thread flags, no thread variables.
    args = container["args"]
    assert not any(arg.startswith("--torch-threads") for arg in args)
    assert not [env for env in container.get("env", []) if "THREADS" in env["name"]]
    # The server parses its flags; SIGTERM's drain fits in the grace period after preStop.
    settings = build_parser({}).parse_args(args)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert (
        int(pre_stop[1]) + float(settings.shutdown_timeout_s) < pod["terminationGracePeriodSeconds"]
    )
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "http": int(settings.port),
        "grpc": int(settings.grpc_port),
        "metrics": int(settings.metrics_port),
    }
    assert int(settings.grpc_port) == DEFAULT_GRPC_PORT
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_service_and_the_disruption_budget_select_the_pods() -> None:
    (deployment,) = of_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (service,) = of_kind("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {port["targetPort"] for port in service["spec"]["ports"]} == {"http", "grpc"}
    (budget,) = of_kind("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_hpa_and_keda_scale_the_deployment_on_the_same_signal_and_target() -> None:
    (deployment,) = of_kind("Deployment")
    (hpa,) = of_kind("HorizontalPodAutoscaler")
    (scaled,) = of_kind("ScaledObject")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert set(trigger["metadata"]) >= {"serverAddress", "query", "threshold"}
    assert metric["pods"]["target"]["averageValue"] == trigger["metadata"]["threshold"]
    assert metric["pods"]["metric"]["name"] in trigger["metadata"]["query"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        scaled["spec"]["minReplicaCount"],
        scaled["spec"]["maxReplicaCount"],
    )


@pytest.mark.anyio
async def test_every_probe_path_and_metric_name_is_served_by_the_real_server() -> None:
    assert metric_names(), "the manifests name no metric"
    assert promql_queries()
    # The app as the manifest runs it: keys on, /metrics on the metrics port. The probes (on
    # the http port) and Prometheus (on the metrics port) carry no key.
    (deployment,) = of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    settings = build_parser({}).parse_args(container["args"])
    assert settings.api_key_file
    app = app_with(
        EchoModel(), api_keys=ApiKeys(["a-key"]), metrics_port=int(settings.metrics_port)
    )
    async with serving(app) as probes:
        probes.base_url = httpx.URL(f"http://pod:{settings.port}")
        for path in sorted(probe_paths()):
            assert (await probes.get(path)).status_code == 200, path
        assert (await probes.get("/v2")).status_code == 401
        probes.base_url = httpx.URL(f"http://pod:{settings.metrics_port}")
        metrics = (await probes.get("/metrics")).text
    served = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines()}
    assert metric_names() <= served, metric_names() - served


# The restricted Pod Security Standard, and what a locked-down deployment adds to it ----------


def test_the_namespace_enforces_the_restricted_standard() -> None:
    (namespace,) = of_kind("Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"


def test_every_pod_meets_the_restricted_standard() -> None:
    pods = pod_templates()
    assert pods
    for pod in pods:
        assert restricted_violations(pod) == []


def _server_pod() -> dict[str, Any]:
    (deployment,) = of_kind("Deployment")
    return copy.deepcopy(deployment["spec"]["template"]["spec"])


@pytest.mark.parametrize(
    "field",
    [
        ("securityContext", "runAsNonRoot"),
        ("securityContext", "seccompProfile"),
        ("containers", 0, "securityContext", "allowPrivilegeEscalation"),
        ("containers", 0, "securityContext", "capabilities"),
    ],
    ids=lambda field: field[-1],
)
def test_the_standards_check_fails_without_each_field(field: tuple[Any, ...]) -> None:
    pod = _server_pod()
    container_context = pod["containers"][0]["securityContext"]
    # Each field is set once, on the pod or the container; take it away where it is.
    if field[0] == "securityContext":
        container_context.pop(field[1], None)
    target: Any = pod
    for key in field[:-1]:
        target = target[key]
    del target[field[-1]]
    assert restricted_violations(pod), field


def test_the_checker_refuses_what_the_standard_forbids() -> None:
    pod = _server_pod()
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    pod["containers"][0]["securityContext"]["runAsUser"] = 0
    assert len(restricted_violations(pod)) == 4


def test_the_pod_is_locked_down_beyond_the_standard() -> None:
    pod = _server_pod()
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    # The read-only root needs a writable /tmp and a writable cache, both emptyDir, where
    # the server puts its exported engines ($XDG_CACHE_HOME/batching/engines).
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {item["name"]: item["value"] for item in container["env"]}
    cache = default_cache_dir(env)
    (cache_mount,) = [path for path in mounts if cache.is_relative_to(path)]
    assert "emptyDir" in volumes[mounts[cache_mount]]
    assert Path(env["HF_HOME"]).is_relative_to(cache_mount)


def test_the_api_keys_come_from_a_secret_mounted_as_the_key_file() -> None:
    pod = _server_pod()
    (container,) = pod["containers"]
    settings = build_parser({}).parse_args(container["args"])
    key_file = Path(settings.api_key_file)
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == key_file.parent]
    assert mount["readOnly"] is True
    # The whole Secret as a folder: a subPath mount would never see the Secret change.
    assert "subPath" not in mount
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] and "items" not in secret  # each key of the Secret is a file
    assert secret.get("optional") is not True  # no Secret, no server: never an open one
    assert not [env for env in container.get("env", []) if "API_KEY" in env["name"]]
    assert not of_kind("Secret")  # no key is kept in the repository


def test_the_network_policy_admits_only_the_gateway_and_prometheus() -> None:
    (deployment,) = of_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    settings = build_parser({}).parse_args(container["args"])
    assert ports["metrics"] == int(settings.metrics_port)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    (policy,) = of_kind("NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    gateway, prometheus = spec["ingress"]
    (source,) = gateway["from"]
    assert source == {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "gateway"}}}
    assert {port["port"] for port in gateway["ports"]} == {"http", "grpc"}
    (source,) = prometheus["from"]
    assert set(source) == {"namespaceSelector", "podSelector"}  # both: Prometheus's pods only
    assert {port["port"] for port in prometheus["ports"]} == {"metrics"}
    for rule in spec["ingress"]:
        assert {port["port"] for port in rule["ports"]} <= set(ports)


def test_images_are_pinned_by_version_or_digest() -> None:
    assert images()
    for image in images():
        name = image.rsplit("/", 1)[-1]
        assert "@sha256:" in image or (":" in name and not name.endswith(":latest")), image


def test_the_server_listens_on_every_address_only_inside_its_container() -> None:
    # 0.0.0.0 is how the pod's port is reachable at all; the NetworkPolicy decides from where.
    pod = _server_pod()
    (container,) = pod["containers"]
    settings = build_parser({}).parse_args(container["args"])
    assert settings.host == "0.0.0.0"
    assert not any(port.get("hostPort") for port in container["ports"])
    assert not pod.get("hostNetwork")
