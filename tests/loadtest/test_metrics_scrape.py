"""``load_test.metrics_scrape``: the batch histogram read from Prometheus text."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from load_test.metrics_scrape import BATCH_METRIC, batch_report, parse_histograms, parse_samples

METRICS_BEFORE = """\
# HELP batching_batch_size_items Items per batch run.
# TYPE batching_batch_size_items histogram
batching_batch_size_items_bucket{le="1.0",model="minilm"} 2.0
batching_batch_size_items_bucket{le="2.0",model="minilm"} 2.0
batching_batch_size_items_bucket{le="4.0",model="minilm"} 3.0
batching_batch_size_items_bucket{le="8.0",model="minilm"} 3.0
batching_batch_size_items_bucket{le="+Inf",model="minilm"} 3.0
batching_batch_size_items_sum{model="minilm"} 5.0
batching_batch_size_items_count{model="minilm"} 3.0
batching_requests_total{code="200",model="minilm"} 3.0
"""

METRICS_AFTER = """\
# HELP batching_batch_size_items Items per batch run.
# TYPE batching_batch_size_items histogram
batching_batch_size_items_bucket{le="1.0",model="minilm"} 4.0
batching_batch_size_items_bucket{le="2.0",model="minilm"} 5.0
batching_batch_size_items_bucket{le="4.0",model="minilm"} 7.0
batching_batch_size_items_bucket{le="8.0",model="minilm"} 13.0
batching_batch_size_items_bucket{le="+Inf",model="minilm"} 13.0
batching_batch_size_items_sum{model="minilm"} 70.0
batching_batch_size_items_count{model="minilm"} 13.0
batching_batch_size_items_bucket{model="other \\"quoted\\"",le="1.0"} 1.0 1700000000000
batching_batch_size_items_bucket{model="other \\"quoted\\"",le="+Inf"} 1.0 1700000000000
batching_batch_size_items_sum{model="other \\"quoted\\""} 1.0
batching_batch_size_items_count{model="other \\"quoted\\""} 1.0
"""


def test_parse_samples_reads_labels_escapes_and_skips_comments() -> None:
    samples = list(parse_samples(METRICS_AFTER))
    assert len(samples) == 11
    name, labels, value = samples[-1]
    assert name == "batching_batch_size_items_count"
    assert labels == {"model": 'other "quoted"'}
    assert value == 1.0
    assert list(parse_samples('up 1\n# comment\n\nx{a="b\\\\c"} +Inf\n')) == [
        ("up", {}, 1.0),
        ("x", {"a": "b\\c"}, math.inf),
    ]


def test_parse_histograms_groups_series_without_le() -> None:
    hists = parse_histograms(METRICS_AFTER)
    assert set(hists) == {'model="minilm"', 'model="other \\"quoted\\""'}
    minilm = hists['model="minilm"']
    assert minilm.buckets[0] == (1.0, 4.0)
    assert minilm.buckets[-1] == (math.inf, 13.0)
    assert (minilm.sum, minilm.count) == (70.0, 13.0)


def test_batch_report_is_the_difference_between_scrapes() -> None:
    report = batch_report(METRICS_BEFORE, METRICS_AFTER)
    assert report is not None
    minilm = report['model="minilm"']
    assert minilm["batches"] == 10
    assert minilm["items"] == 65
    assert minilm["mean_size"] == 6.5
    assert minilm["sizes"] == {"1": 2, "2": 1, "3-4": 1, "5-8": 6}
    assert minilm["p50_bucket"] == "5-8"
    # A series that appeared between the scrapes counts from zero.
    assert report['model="other \\"quoted\\""']["batches"] == 1


def test_batch_report_without_the_histogram_is_none() -> None:
    assert batch_report(None, None) is None
    assert batch_report("", "up 1\n") is None


# --- what prometheus_client itself writes -------------------------------------------------

QUOTED = 'odd "name" \\ with\nnewline'


def _registry() -> tuple[CollectorRegistry, Histogram, Counter]:
    registry = CollectorRegistry()
    sizes = Histogram(
        BATCH_METRIC,
        "Items per batch run.",
        ["model"],
        buckets=(1, 2, 4, 8),
        registry=registry,
    )
    requests = Counter(
        "batching_requests", "Requests answered.", ["model", "code"], registry=registry
    )
    Gauge("batching_instances_ready", "Ready instances.", ["model"], registry=registry).labels(
        model="minilm"
    ).set(2)
    return registry, sizes, requests


def _scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_parse_samples_reads_a_real_registry() -> None:
    registry, sizes, requests = _registry()
    requests.labels(model="minilm", code="200").inc(7)
    requests.labels(model=QUOTED, code="503").inc(2)
    for size in (1, 3, 3, 20):
        sizes.labels(model="minilm").observe(size)
    samples = list(parse_samples(_scrape(registry)))
    values = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples}
    assert values["batching_requests_total", (("code", "200"), ("model", "minilm"))] == 7.0
    # Quotes, backslashes and newlines in a label value come back as they went in.
    assert values["batching_requests_total", (("code", "503"), ("model", QUOTED))] == 2.0
    assert values["batching_instances_ready", (("model", "minilm"),)] == 2.0
    buckets = {
        labels["le"]: value
        for name, labels, value in samples
        if name == f"{BATCH_METRIC}_bucket" and labels["model"] == "minilm"
    }
    assert buckets == {"1.0": 1.0, "2.0": 1.0, "4.0": 3.0, "8.0": 3.0, "+Inf": 4.0}
    assert all(isinstance(value, float) for _, _, value in samples)


def test_parse_histograms_reads_a_real_registry() -> None:
    registry, sizes, _ = _registry()
    for size in (1, 3, 3, 20):
        sizes.labels(model="minilm").observe(size)
    sizes.labels(model=QUOTED).observe(2)
    hists = parse_histograms(_scrape(registry))
    quoted_key = 'model="odd \\"name\\" \\\\ with\\nnewline"'
    assert set(hists) == {'model="minilm"', quoted_key}
    minilm = hists['model="minilm"']
    assert minilm.buckets == ((1.0, 1.0), (2.0, 1.0), (4.0, 3.0), (8.0, 3.0), (math.inf, 4.0))
    assert (minilm.sum, minilm.count) == (27.0, 4.0)
    assert hists[quoted_key].buckets[1] == (2.0, 1.0)


def test_batch_report_between_two_scrapes_of_a_real_registry() -> None:
    registry, sizes, requests = _registry()
    minilm = sizes.labels(model="minilm")
    for size in (1, 8):
        minilm.observe(size)
    before = _scrape(registry)
    for size in (1, 2, 2, 3, 5, 8, 8, 30):
        minilm.observe(size)
    requests.labels(model="minilm", code="200").inc(8)
    report = batch_report(before, _scrape(registry))
    assert report == {
        'model="minilm"': {
            "batches": 8,
            "items": 59,
            "mean_size": 7.375,
            "sizes": {"1": 1, "2": 2, "3-4": 1, "5-8": 3, ">8": 1},
            "p50_bucket": "3-4",
            "p99_bucket": ">8",
        }
    }


def test_malformed_exposition_is_an_error() -> None:
    with pytest.raises(ValueError):
        list(parse_samples('x{a="unterminated} 1\n'))
