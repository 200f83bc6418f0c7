"""OpenTelemetry traces: a server span per request on every door, a span per batch linked to
the requests it carried (docs/tracing.md).

``config`` (the settings) and ``spans`` (a request's span in a context variable) import no
OpenTelemetry; ``provider`` and ``batches`` do, and are imported only when tracing is on.
The core knows nothing of this: it reports batches and requests through its observer
(:class:`~batching.core.events.BatchEvents`), with each request's span as an opaque object.
"""
