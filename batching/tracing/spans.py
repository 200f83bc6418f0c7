"""A request's server span while the request is served, and the context variable the doors
set it in, so that the data plane finds it without any door passing it along.

This module imports no OpenTelemetry at run time: with tracing off no :class:`RequestSpan`
is ever made, and what the data plane pays is one :func:`current_span` lookup per request.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

from batching.core.events import RequestRun

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["RequestSpan", "current_span", "reset_current_span", "set_current_span"]

_CURRENT: contextvars.ContextVar[RequestSpan | None] = contextvars.ContextVar(
    "batching_request_span", default=None
)


def current_span() -> RequestSpan | None:
    """The span of the request being served in this context, or None (tracing off)."""
    return _CURRENT.get()


def set_current_span(span: RequestSpan | None) -> contextvars.Token[RequestSpan | None]:
    """Make ``span`` the current request's span; reset with the token returned."""
    return _CURRENT.set(span)


def reset_current_span(token: contextvars.Token[RequestSpan | None]) -> None:
    """Undo the :func:`set_current_span` that returned ``token``."""
    _CURRENT.reset(token)


class RequestSpan:
    """One request's server span: the data plane adds the model, the items and the tokens,
    the batcher's events add the time queued, in batches and computed, and the door ends it
    when the answer is sent, with the outcome. What is learnt on the way is kept here and set
    on the span once, at its end (one call into the SDK, not one per fact); whatever comes
    after the end (a request whose queued items are dropped after its client left) is
    ignored."""

    __slots__ = ("attributes", "ended", "items", "span", "tokens")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.ended = False
        self.items = 0
        self.tokens = 0
        #: Set on the span when it ends.
        self.attributes: dict[str, str | int | float | bool] = {}

    @property
    def recording(self) -> bool:
        return not self.ended and self.span.is_recording()

    def model(self, name: str) -> None:
        """The request is for model ``name``."""
        self.attributes["batching.model"] = name

    def submitted(self, model: str, items: int, tokens: list[int] | None) -> None:
        """``items`` (with ``tokens``, their token counts, when counted) were queued."""
        attributes = self.attributes
        attributes["batching.model"] = model
        self.items += items
        attributes["batching.items"] = self.items
        if tokens:
            self.tokens += sum(tokens)
            attributes["batching.tokens"] = self.tokens

    def ran(self, run: RequestRun) -> None:
        """How the request went in the batcher: seconds queued, in batches, computed."""
        if self.ended:
            return
        attributes = self.attributes
        attributes["batching.queue_seconds"] = run.queue_s
        attributes["batching.batched_seconds"] = run.batched_s
        attributes["batching.compute_seconds"] = run.compute_s
        attributes["batching.batches"] = run.batches

    def end(self, reason: str | None, error: str | None) -> None:
        """End the span once: ``reason`` says why a request had no result (refused, failed,
        disconnected), ``error`` (the ``error.type``) marks a failure of the server's own."""
        if self.ended:
            return
        self.ended = True
        span = self.span
        if span.is_recording():
            attributes = self.attributes
            if reason is not None:
                attributes["batching.reason"] = reason
            if error is not None:
                from opentelemetry.trace import Status, StatusCode

                attributes["error.type"] = error
                span.set_status(Status(StatusCode.ERROR, reason))
            span.set_attributes(attributes)
        span.end()
