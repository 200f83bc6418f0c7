"""The table an engine decision was made from, as ``--prepare`` prints it: per variant and
length timed, the items per second at each batch size, the cores other processes used while it
was timed, its accuracy against torch fp32, and the batch sizes it serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .decision import Decision

__all__ = ["decision_table"]


def decision_table(described: Mapping[str, Any]) -> list[str]:
    """Markdown lines of the table behind ``described`` (a decision's JSON, as the model's
    metadata shows it under ``engine``)."""
    decision = Decision.from_json(described)
    sizes = sorted({size for m in decision.measurements for size in m.items_per_s})
    head = " | ".join(f"batch {size} items/s" for size in sizes)
    lines = [
        f"| variant | tokens | {head} | busy cores | accuracy | route |",
        "|---|---|" + "---|" * len(sizes) + "---|---|---|",
    ]
    for m in decision.measurements:
        routes = [r for r in decision.routes if r.name == m.name]
        route = ", ".join(f"batches {r.first}-{r.last}" for r in routes) or "-"
        busy = "-" if m.busy_cores is None else f"{m.busy_cores:.2f}"
        accuracy = m.accuracy_text or (m.error or "-")
        rows = [(str(tokens), rates) for tokens, rates in sorted(m.by_length.items())]
        rows.append(("traffic mix" if rows else "-", m.items_per_s))
        for tokens, rates in rows:
            cells = " | ".join(f"{rates[size]:.0f}" if size in rates else "-" for size in sizes)
            lines.append(f"| {m.name} | {tokens} | {cells} | {busy} | {accuracy} | {route} |")
    lines.append(f"chosen: {decision.describe()}")
    return lines
