"""The Kubernetes manifests in ``deploy/kubernetes``: their documents, and the PromQL in them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
#: The namespace the kustomizations put everything in (Prometheus labels series with it).
NAMESPACE = "batching"

METRIC = re.compile(r"\bbatching_[a-z_]+\b")


def manifest_files() -> list[Path]:
    return sorted(KUBERNETES.rglob("*.yaml"))


def documents() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((path, document))
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in documents() if document.get("kind") == kind]


def adapter_rules() -> list[dict[str, Any]]:
    (config_map,) = [
        document
        for document in of_kind("ConfigMap")
        if document["metadata"]["name"] == "prometheus-adapter-batching-rules"
    ]
    rules: list[dict[str, Any]] = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    return rules


def promql_queries() -> list[str]:
    """Every PromQL query the manifests make Prometheus run, as Prometheus runs it: the KEDA
    trigger's query, and each adapter rule's metricsQuery rendered for one pod-grouped
    lookup in the namespace (as the adapter renders it for a Pods metric)."""
    queries = []
    for scaled in of_kind("ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                queries.append(trigger["metadata"]["query"])
    for rule in adapter_rules():
        series = METRIC.search(rule["seriesQuery"])
        assert series is not None, rule
        queries.append(
            rule["metricsQuery"]
            .replace("<<.Series>>", series.group(0))
            .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod!=""')
            .replace("<<.GroupBy>>", "pod")
        )
    return queries


def metric_names() -> set[str]:
    """Every ``batching_*`` metric the manifests name: in queries, rules and HPA metrics."""
    names: set[str] = set()
    for query in promql_queries():
        names.update(METRIC.findall(query))
    for rule in adapter_rules():
        names.update(METRIC.findall(rule["seriesQuery"]))
    for hpa in of_kind("HorizontalPodAutoscaler"):
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Pods":
                names.add(metric["pods"]["metric"]["name"])
    return names


def probe_paths() -> set[str]:
    paths = set()
    for deployment in of_kind("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                paths.add(container[probe]["httpGet"]["path"])
    return paths
