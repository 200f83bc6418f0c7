"""The batch sizes the server formed, from its Prometheus ``/metrics`` before and after a run.

The text exposition format is parsed by ``prometheus_client``'s parser; of a histogram only
the ``_bucket``, ``_sum`` and ``_count`` samples are used, and timestamps are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "BATCH_METRIC",
    "Histogram",
    "batch_report",
    "fetch_metrics",
    "histogram_delta",
    "parse_histograms",
    "parse_samples",
]

BATCH_METRIC = "batching_batch_size_items"


@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram series: cumulative ``buckets`` by upper bound, plus ``sum`` and ``count``."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


def parse_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Yield ``(metric name, labels, value)`` for each sample line of an exposition.

    Parsed by :func:`prometheus_client.parser.text_string_to_metric_families`; a malformed
    line raises :class:`ValueError`.
    """
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, dict(sample.labels), float(sample.value)


def _series_key(labels: dict[str, str]) -> str:
    # The series' identity: every label but "le", as Prometheus writes it.
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != "le")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_histograms(text: str, metric: str = BATCH_METRIC) -> dict[str, Histogram]:
    """Each series of histogram ``metric`` by its labels (``model="..."``), without ``le``."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for name, labels, value in parse_samples(text):
        key = _series_key(labels)
        if name == f"{metric}_bucket" and "le" in labels:
            buckets.setdefault(key, []).append((float(labels["le"]), value))
        elif name == f"{metric}_sum":
            sums[key] = value
        elif name == f"{metric}_count":
            counts[key] = value
    return {
        key: Histogram(tuple(sorted(series)), sums.get(key, math.nan), counts.get(key, 0.0))
        for key, series in buckets.items()
    }


def histogram_delta(before: Histogram | None, after: Histogram) -> Histogram:
    """What was observed between two scrapes (a series absent before counts from zero)."""
    if before is None:
        return after
    earlier = dict(before.buckets)
    return Histogram(
        tuple((le, value - earlier.get(le, 0.0)) for le, value in after.buckets),
        after.sum - before.sum,
        after.count - before.count,
    )


def _bucket_label(low: float, high: float) -> str:
    if math.isinf(high):
        return f">{low:g}"
    if high - low <= 1:
        return f"{high:g}"
    return f"{low + 1:g}-{high:g}"


def batch_report(before: str | None, after: str | None) -> dict[str, Any] | None:
    """Batches formed between two ``/metrics`` texts, per series, or None if not exposed.

    Each series gives ``batches``, ``items``, ``mean_size``, the batches per size bucket
    (non-cumulative, labelled like ``"3-4"``) and the bucket holding the median and p99 batch.
    """
    if after is None:
        return None
    now = parse_histograms(after)
    if not now:
        return None
    then = parse_histograms(before) if before is not None else {}
    report: dict[str, Any] = {}
    for key, hist in sorted(now.items()):
        delta = histogram_delta(then.get(key), hist)
        if delta.count <= 0:
            continue
        per_bucket: dict[str, int] = {}
        low = 0.0
        previous = 0.0
        for le, cumulative in delta.buckets:
            per_bucket[_bucket_label(low, le)] = int(round(cumulative - previous))
            low, previous = le, cumulative
        report[key or "(no labels)"] = {
            "batches": int(round(delta.count)),
            "items": int(round(delta.sum)),
            "mean_size": round(delta.sum / delta.count, 3),
            "sizes": {k: v for k, v in per_bucket.items() if v},
            "p50_bucket": _quantile_bucket(delta, 0.5),
            "p99_bucket": _quantile_bucket(delta, 0.99),
        }
    return report


def _quantile_bucket(hist: Histogram, q: float) -> str | None:
    target = q * hist.count
    low = 0.0
    for le, cumulative in hist.buckets:
        if cumulative >= target - 1e-9:
            return _bucket_label(low, le)
        low = le
    return None


def fetch_metrics(url: str, timeout: float = 5.0) -> str | None:
    """The exposition text at ``url``, or None when the server has no (reachable) metrics."""
    import httpx

    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return response.text
