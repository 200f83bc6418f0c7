"""Reading the server's ``/metrics`` in tests, with prometheus-client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample(metrics_text: str, name: str, default: float | None = None, **labels: str) -> float:
    """The value of the sample ``name`` whose labels include ``labels``.

    :raises KeyError: when there is no such sample and no ``default``.
    """
    for family in text_string_to_metric_families(metrics_text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    if default is not None:
        return default
    raise KeyError(f"no sample {name} with {labels}")
