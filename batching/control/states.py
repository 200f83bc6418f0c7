"""The states the repository index, readiness and ``batching_model_state`` show: every model
and version the server knows of, served or not."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batching.plane import Deployments

__all__ = ["STATES", "StateCollector", "model_states"]

#: The states the repository index, readiness and ``batching_model_state`` show.
STATES = ("LOADING", "READY", "UNLOADING", "UNAVAILABLE")


def model_states(deployments: Deployments) -> list[dict[str, object]]:
    """Every model and version the server knows of, with its state and, when it is not
    ready, why: the served ones (READY; LOADING until warm or while an instance restarts;
    UNAVAILABLE when their load failed), then the others (loading beside a served version,
    unloading, unloaded, failed at run time). A ready model also says the resident memory its
    instances' loads added (``memory_mb``)."""
    states: list[dict[str, object]] = []
    for deployment in deployments:
        entry: dict[str, object] = {"name": deployment.name, "version": deployment.config.version}
        if deployment.ready:
            entry["state"] = "READY"
            entry["memory_mb"] = round(sum(deployment.memory_bytes.values()) / 2**20, 1)
        elif deployment.load_error_class:
            # Never the load error's text, which may hold paths: its class, and where to look.
            entry["state"] = "UNAVAILABLE"
            entry["reason"] = (
                f"failed to load ({deployment.load_error_class}; the server log has the details)"
            )
        else:
            entry["state"] = "LOADING"
            entry["reason"] = "loading"
        states.append(entry)
    states.extend(dict(entry) for entry in deployments.others.values())
    return states


class StateCollector(Collector):
    """``batching_model_state{model,version,state}``: 1 for each model version in each of its
    states now (a version loading beside its served copy is in two), read at the scrape."""

    def __init__(self, deployments: Deployments) -> None:
        self.deployments = deployments

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "batching_model_state",
            "Models and versions by state (LOADING, READY, UNLOADING, UNAVAILABLE): 1 for each "
            "state a version is in",
            labels=["model", "version", "state"],
        )
        seen: set[tuple[str, str, str]] = set()
        for entry in model_states(self.deployments):
            labels = (str(entry["name"]), str(entry["version"]), str(entry["state"]))
            if labels not in seen:
                seen.add(labels)
                family.add_metric(list(labels), 1.0)
        yield family
