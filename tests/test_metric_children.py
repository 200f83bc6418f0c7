"""The request path's label children, resolved once each
(:meth:`batching.metrics.Metrics.child`)."""

from __future__ import annotations

from prometheus_client import generate_latest

from batching.metrics import Metrics


def test_a_child_is_resolved_once_and_counts_in_its_family() -> None:
    metrics = Metrics()
    child = metrics.child(metrics.requests, "m", "200")
    assert metrics.child(metrics.requests, "m", "200") is child
    assert metrics.child(metrics.requests, "m", "503") is not child
    child.inc()
    metrics.child(metrics.requests, "m", "200").inc()
    text = generate_latest(metrics.registry).decode()
    assert 'batching_requests_total{code="200",model="m"} 2.0' in text


def test_the_same_labels_of_two_families_are_two_children() -> None:
    metrics = Metrics()
    rejected = metrics.child(metrics.rejected, "m", "deadline")
    dropped = metrics.child(metrics.dropped, "m", "deadline")
    assert rejected is not dropped
    rejected.inc()
    text = generate_latest(metrics.registry).decode()
    assert 'batching_rejected_total{model="m",reason="deadline"} 1.0' in text
    assert 'batching_dropped_items_total{model="m",reason="deadline"} 0.0' in text
