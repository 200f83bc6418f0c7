"""Batch spans: the batcher's observer, wrapped, makes one span per batch that carried traced
requests, linked to the server span of each of them.

A batch runs the items of several requests, so it has no one parent: following the
OpenTelemetry specification ("Links between spans": a span initiated by several spans, one
per item of a batch), it is a root span with a link to every request span whose items it
carried, given at creation so that the sampler sees them. The core reports the batch when it
has run (:class:`~batching.core.events.BatchRun`, on the event loop, whatever kind of instance
ran it: a process instance's batch is reported by the parent), so the span is made then, with
its start set back by the time the batch took.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Tracer

from batching.core.events import BatchEvents, BatchRun, RequestRun
from batching.runtime.deployment import Deployment

from .spans import RequestSpan

__all__ = ["BATCH_MARK", "BatchSpans"]

#: The attribute that marks a batch span (the sampler keeps one whose links were kept).
BATCH_MARK = "batching.batch.size"


def engine_of(metadata: Mapping[str, object], items: int) -> tuple[str, str] | None:
    """The engine and precision that run batches of ``items``, as the model's metadata says
    (``engine.routes``, each with its batch sizes); None when it says nothing."""
    engine = metadata.get("engine")
    if not isinstance(engine, dict):
        return None
    for route in engine.get("routes", []):
        first, last = route["batch_sizes"]
        if first <= items <= last:
            return str(route["engine"]), str(route["precision"])
    return None


class BatchSpans:
    """``inner``'s events, with a span for each batch of ``model`` that carried traced
    requests, and each traced request's times set on its span."""

    def __init__(self, inner: BatchEvents, tracer: Tracer, model: str, instance_kind: str) -> None:
        self.inner = inner
        self.tracer = tracer
        self.model = model
        self.instance_kind = instance_kind
        #: The model's deployment, for the engine that runs it (set by the app).
        self.deployment: Deployment | None = None

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None:
        self.inner.batch_done(items, tokens, reason, queue_wait, compute_s)

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        self.inner.request_done(queue_s, compute_s, total_s, ok)

    def rejected(self, reason: str) -> None:
        self.inner.rejected(reason)

    def step_done(self, rows: int, seconds: float) -> None:
        self.inner.step_done(rows, seconds)

    def dropped(self, reason: str, items: int) -> None:
        self.inner.dropped(reason, items)

    def request_ran(self, trace: object, run: RequestRun) -> None:
        self.inner.request_ran(trace, run)
        if isinstance(trace, RequestSpan):
            trace.ran(run)

    def batch_ran(self, batch: BatchRun) -> None:
        self.inner.batch_ran(batch)
        links = [
            Link(trace.span.get_span_context())
            for trace in batch.traces
            if isinstance(trace, RequestSpan)
        ]
        if not any(link.context.trace_flags.sampled for link in links):
            return  # no kept request ran in it: nothing would show the batch
        attributes: dict[str, str | int | float] = {
            BATCH_MARK: batch.items,
            "batching.model": self.model,
            "batching.batch.requests": len(links),
            "batching.batch.padded_tokens": batch.tokens,
            "batching.batch.release_reason": batch.reason,
            "batching.batch.queue_wait_seconds": batch.queue_wait,
            "batching.compute_seconds": batch.compute_s,
            "batching.instance": batch.instance,
            "batching.instance.kind": self.instance_kind,
        }
        deployment = self.deployment
        if deployment is not None:
            chosen = engine_of(deployment.metadata, batch.items)
            if chosen is not None:
                attributes["batching.engine"], attributes["batching.precision"] = chosen
            else:
                attributes["batching.engine"] = deployment.platform
        ended = time.time_ns()
        span = self.tracer.start_span(
            f"batch {self.model}",
            context=Context(),  # a root: its requests are its links, not its parent
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=ended - round(batch.run_s * 1e9),
        )
        span.end(end_time=ended)
