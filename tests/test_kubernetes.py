"""The Kubernetes manifests (``deploy/kubernetes``): valid offline against a current Kubernetes
(kubernetes-validate, strict), consistent with each other, and naming only probe paths and
metrics the real server serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from batching.settings.cli import DEFAULT_GRPC_PORT, build_parser
from tests.support.asgi import app_with, serving
from tests.support.manifests import (
    KUBERNETES,
    NAMESPACE,
    documents,
    manifest_files,
    metric_names,
    of_kind,
    probe_paths,
    promql_queries,
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
    assert ports == {"http": int(settings.port), "grpc": int(settings.grpc_port)}
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
    async with serving(app_with(EchoModel())) as client:
        for path in sorted(probe_paths()):
            assert (await client.get(path)).status_code == 200, path
        metrics = (await client.get("/metrics")).text
    served = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines()}
    assert metric_names() <= served, metric_names() - served
