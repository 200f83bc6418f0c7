"""The server span of every gRPC call: a ``grpc.aio`` interceptor, first of the door's, so that
a call refused before its method runs (UNAUTHENTICATED) has one too.

The span is parented on the call's ``traceparent`` metadata when it has one, set as the current
request span for the data plane (:mod:`batching.tracing.spans`) while the method runs, and
ended when the method has answered, with the status code (``rpc.grpc.status_code``) and, for
a call answered with an error or cancelled by its caller, why (``batching.reason``). Only
installed when tracing is on.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from batching.tracing.spans import RequestSpan, reset_current_span, set_current_span

if TYPE_CHECKING:
    from batching.tracing.provider import Tracing

__all__ = ["TracingInterceptor"]

#: Codes that are the server's failure, not the caller's (OpenTelemetry's gRPC conventions).
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _end(span: RequestSpan, context: Any, failed: BaseException | None) -> None:
    """End ``span`` with the code ``context`` was answered with."""
    reason: str | None
    if failed is not None and not isinstance(failed, Exception):
        code, reason = grpc.StatusCode.CANCELLED, "the call was cancelled"
    elif failed is not None:
        code, reason = grpc.StatusCode.UNKNOWN, f"internal error: {type(failed).__name__}"
    else:
        code = context.code() or grpc.StatusCode.OK
        reason = None if code == grpc.StatusCode.OK else (context.details() or code.name)
    if isinstance(code, int):
        code = next((each for each in grpc.StatusCode if each.value[0] == code), code)
    if isinstance(code, grpc.StatusCode):
        span.attributes["rpc.grpc.status_code"] = code.value[0]
    error = code.name if code in SERVER_ERRORS else None
    span.end(reason, error)


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Starts, and ends with its status, the server span of every call."""

    def __init__(self, tracing: Tracing) -> None:
        from opentelemetry.trace import SpanKind

        self.tracing = tracing
        self._kind = SpanKind.SERVER

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.response_streaming:
            return handler
        method: str = handler_call_details.method
        metadata = handler_call_details.invocation_metadata or ()
        fields = self.tracing.fields
        carrier = {
            key: value
            for name, value in metadata
            if (key := str(name).lower()) in fields and isinstance(value, str)
        }
        service, _, name = method.lstrip("/").rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        def traced(behavior: Callable[[Any, Any], Awaitable[Any]]) -> Callable[..., Any]:
            async def run(request: Any, context: Any) -> Any:
                span = self.tracing.request(method.lstrip("/"), carrier, self._kind, attributes)
                token = set_current_span(span)
                failed: BaseException | None = None
                try:
                    return await behavior(request, context)
                except BaseException as exc:
                    failed = exc
                    raise
                finally:
                    reset_current_span(token)
                    _end(span, context, failed)

            return run

        if handler.request_streaming and inspect.iscoroutinefunction(handler.stream_unary):
            return grpc.stream_unary_rpc_method_handler(
                traced(handler.stream_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if not handler.request_streaming and inspect.iscoroutinefunction(handler.unary_unary):
            return grpc.unary_unary_rpc_method_handler(
                traced(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
