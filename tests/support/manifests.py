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


def pod_templates() -> list[dict[str, Any]]:
    """The pod spec of every workload in the manifests."""
    return [
        document["spec"]["template"]["spec"]
        for _, document in documents()
        if document["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
    ]


#: The restricted standard's volume types.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in ``pod`` (a pod spec) breaks the restricted Pod Security Standard, baseline
    controls included (kubernetes.io/docs/concepts/security/pod-security-standards/, as the
    PodSecurity admission controller checks them): one entry per failed check."""
    found: list[str] = []
    context = pod.get("securityContext", {})
    containers = [
        *pod.get("containers", []),
        *pod.get("initContainers", []),
        *pod.get("ephemeralContainers", []),
    ]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(f"host namespaces: {flag}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume types: {volume['name']} is {sorted(kinds)}")
    for sysctl in context.get("sysctls", []):
        if sysctl["name"] not in _SAFE_SYSCTLS:
            found.append(f"sysctls: {sysctl['name']}")
    contexts = [("pod", context)] + [(c["name"], c.get("securityContext", {})) for c in containers]
    for where, ctx in contexts:
        if ctx.get("windowsOptions", {}).get("hostProcess"):
            found.append(f"host process: {where}")
        selinux = ctx.get("seLinuxOptions", {})
        if (
            selinux.get("type", "") not in _SELINUX_TYPES
            or selinux.get("user")
            or selinux.get("role")
        ):
            found.append(f"SELinux: {where}")
        if ctx.get("appArmorProfile", {}).get("type", "RuntimeDefault") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            found.append(f"AppArmor: {where}")
        if ctx.get("runAsUser") == 0:
            found.append(f"running as non-root user: {where} runs as uid 0")
        if ctx.get("runAsNonRoot") is False:
            found.append(f"running as non-root: {where} sets runAsNonRoot false")
        if ctx.get("seccompProfile", {}).get("type") == "Unconfined":
            found.append(f"seccomp: {where} is Unconfined")
    pod_non_root = context.get("runAsNonRoot") is True
    pod_seccomp = context.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost")
    for container in containers:
        name = container["name"]
        ctx = container.get("securityContext", {})
        if ctx.get("privileged"):
            found.append(f"privileged: {name}")
        if ctx.get("procMount", "Default") != "Default":
            found.append(f"/proc mount: {name}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"host ports: {name}")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"privilege escalation: {name} must set allowPrivilegeEscalation false")
        if not (pod_non_root or ctx.get("runAsNonRoot") is True):
            found.append(f"running as non-root: {name} must set runAsNonRoot true")
        if not (
            pod_seccomp
            or ctx.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost")
        ):
            found.append(f"seccomp: {name} needs RuntimeDefault or Localhost")
        capabilities = ctx.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"capabilities: {name} must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"capabilities: {name} adds more than NET_BIND_SERVICE")
    return found


def images() -> list[str]:
    """Every container image the manifests run."""
    return [
        container["image"]
        for pod in pod_templates()
        for container in [*pod.get("containers", []), *pod.get("initContainers", [])]
    ]
