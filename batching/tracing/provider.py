"""The OpenTelemetry SDK, set up for one app: its tracer provider, sampler and OTLP exporter,
and the server spans of requests. Imported only when tracing is on (``create_app`` imports it
lazily), so a server without ``--otlp-endpoint`` never loads OpenTelemetry.

The provider is the app's own, never the process-wide global one: embedding the app changes
nothing process-wide. Spans leave through a batch span processor (``OTEL_BSP_*`` apply), so
exporting never runs on the request path; the exporter reads the standard
``OTEL_EXPORTER_OTLP_*`` variables (headers, timeout, compression, certificates).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from batching.core.events import BatchEvents
from batching.model_config import ModelConfig
from batching.runtime.deployment import Deployment

from .batches import BATCH_MARK, BatchSpans
from .spans import RequestSpan
from .tracing_config import TracingConfig

__all__ = ["Tracing", "exporter_for", "sampler_for"]

SCOPE = "batching"


def sampler_for(config: TracingConfig) -> Sampler:
    """The standard sampler ``config`` names, under :class:`LinkedBatches`."""
    ratio = TraceIdRatioBased(config.ratio)
    root = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(ratio),
    }[config.sampler]
    return LinkedBatches(root)


class LinkedBatches(Sampler):
    """``inner``'s decisions, except for batch spans: a batch span is kept when one of the
    request spans it links to was kept, whatever the ratio, so that a kept request always
    shows the batch it ran in (the links are given at creation so that this sampler sees
    them)."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if attributes and BATCH_MARK in attributes:
            sampled = any(link.context.trace_flags.sampled for link in links or ())
            decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
            return SamplingResult(decision, attributes if sampled else None)
        return self.inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"LinkedBatches{{{self.inner.get_description()}}}"


def exporter_for(config: TracingConfig) -> SpanExporter:
    """The OTLP exporter of ``config``'s protocol, sending to its endpoint."""
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(
            endpoint=config.endpoint, insecure=config.endpoint.startswith("http://")
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=config.endpoint)


def _resource(default_name: str) -> Resource:
    """The SDK's resource from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``; the
    service is named ``default_name`` when they do not name it."""
    resource = Resource.create()
    named = str(resource.attributes.get(SERVICE_NAME, ""))
    if not named or named.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_name}))
    return resource


class Tracing:
    """One app's tracing: request spans for the doors, batch spans from the batcher's events.

    :param config: where spans go and which are kept.
    :param processor: replaces the batch span processor over the OTLP exporter (tests).
    """

    def __init__(self, config: TracingConfig, processor: SpanProcessor | None = None) -> None:
        self.config = config
        self.provider = TracerProvider(
            sampler=sampler_for(config),
            resource=_resource(config.service_name),
            shutdown_on_exit=False,
        )
        self._processor = processor or BatchSpanProcessor(exporter_for(config))
        self.provider.add_span_processor(self._processor)
        #: The request headers (gRPC metadata keys) the propagators read: the carrier holds
        #: only these.
        self.fields = frozenset(propagate.get_global_textmap().fields)
        self.tracer = self.provider.get_tracer(SCOPE)
        self._batches: dict[str, BatchSpans] = {}

    def request(
        self,
        name: str,
        carrier: Mapping[str, str],
        kind: SpanKind,
        attributes: Mapping[str, str | int],
    ) -> RequestSpan:
        """Start the server span of one request, parented on the ``traceparent`` (and
        ``tracestate``) of ``carrier`` (its headers or metadata, lowercase keys) when it has
        one, by the propagators ``OTEL_PROPAGATORS`` names (W3C trace context by default)."""
        parent = propagate.extract(carrier)
        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        return RequestSpan(span)

    def observe(self, events: BatchEvents, config: ModelConfig) -> BatchSpans:
        """``events`` with a span for each batch of ``config``'s model that carried traced
        requests; :meth:`describe` then tells it the model's deployment."""
        spans = BatchSpans(events, self.tracer, config.name, config.instance_kind)
        self._batches[config.name] = spans
        return spans

    def describe(self, deployments: Iterable[Deployment]) -> None:
        """Each model's batch spans name the engine its deployment's metadata says runs it."""
        for deployment in deployments:
            spans = self._batches.get(deployment.name)
            if spans is not None:
                spans.deployment = deployment

    def shutdown(self, timeout: float) -> None:
        """Export what is buffered and stop, waiting at most ``timeout`` seconds for the
        collector (at the app's shutdown: an unreachable collector never holds it up)."""
        processor = self._processor
        # force_flush's own timeout does not cut short an export that is retrying.
        flushing = threading.Thread(target=processor.force_flush, daemon=True)
        flushing.start()
        flushing.join(timeout)
        if isinstance(processor, BatchSpanProcessor):
            # Stops an export still retrying: what it held is dropped, not waited for.
            processor.span_exporter.shutdown()
        self.provider.shutdown()
