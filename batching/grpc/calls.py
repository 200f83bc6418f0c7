"""How the gRPC door receives a call's message and refuses a call.

Every unary method of ``inference.GRPCInferenceService`` is registered as a client-streaming
handler whose message the door reads itself (:func:`method_handlers`), which grpc-python's
unary handlers cannot do. That gives the door three things:

- a **message timeout**: a call starts when its headers arrive; a message that has not arrived
  ``message_timeout`` seconds later is answered ``DEADLINE_EXCEEDED`` (HTTP's 408 for a body
  that never comes), so calls cannot sit open forever on a connection that is not idle;
- **deserialization off the event loop** for messages over :data:`OFFLOAD_BYTES`;
- a **count of the messages grpc-core refused**: a message over ``--max-body-bytes`` is refused
  by grpc-core (``RESOURCE_EXHAUSTED``, before it is buffered or inflated), and the door sees a
  call that ends without a message. It counts it as a 413 (``too_large``); a client that sends
  no message at all (none of the standard clients can) is counted the same, and answered
  ``INVALID_ARGUMENT``.

A refusal never raises: :func:`refuse` sets the status and details on the context and the
handler returns None. ``context.abort`` raises an ``AbortError`` that grpc keeps on the call's
state, whose traceback holds the handler's frames (and through them the request and the
context, a cycle): every refused call then stayed in memory, about twice its size, until a
full garbage collection, which a server tuned for short pauses seldom runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2_grpc

__all__ = [
    "OFFLOAD_BYTES",
    "REQUEST_ID_KEY",
    "SERVICE",
    "Counter",
    "method_handlers",
    "refuse",
]

#: The service's full name, as the generated stubs register it.
SERVICE = "inference.GRPCInferenceService"

#: Messages larger than this are deserialized on a worker thread, not on the event loop.
OFFLOAD_BYTES = 64 * 1024

#: The metadata key the request id is sent back under (and may be sent with).
REQUEST_ID_KEY = "x-request-id"

#: Told of each call refused before its method ran: the HTTP status it counts as, the
#: ``batching_rejected_total`` reason (None: not a rejection, a malformed call) and the loop
#: time the call started.
Counter = Callable[[int, str | None, float], None]


def refuse(
    context: Any, code: grpc.StatusCode, message: str, request_id: str | None = None
) -> None:
    """Answer the call with ``code`` and ``message`` once its handler returns (None); with
    ``request_id`` in the trailing metadata. Raises nothing, so nothing keeps the call's
    frames alive (see the module's text)."""
    if request_id:
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
    context.set_code(code)
    context.set_details(message)


class _Collector:
    """Stands in for a server to collect the generated stubs' handlers by method name."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.handlers.update(handlers)


def method_handlers(
    servicer: Any, *, message_timeout: float, count: Counter
) -> dict[str, grpc.RpcMethodHandler]:
    """The service's handlers by method name, each unary one reading its own message (see the
    module's text). ``message_timeout`` 0 waits for the message as long as the call lasts."""
    collector = _Collector()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, collector)
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name, handler in collector.handlers.items():
        if handler.request_streaming or handler.response_streaming:
            handlers[name] = handler
            continue
        handlers[name] = grpc.stream_unary_rpc_method_handler(
            _receiving(
                name, handler.unary_unary, handler.request_deserializer, message_timeout, count
            ),
            response_serializer=handler.response_serializer,
        )
    return handlers


def _receiving(
    name: str,
    behavior: Callable[[Any, Any], Awaitable[Any]],
    deserialize: Callable[[bytes], Any],
    timeout: float,
    count: Counter,
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(requests: Any, context: Any) -> Any:
        started = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(timeout or None):
                message = await context.read()
        except TimeoutError:
            count(408, "message_timeout", started)
            refuse(
                context,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request message did not arrive within {timeout:g} s",
            )
            return None
        if message is grpc.aio.EOF:
            # grpc-core refused it (over the size limit), or the client sent none.
            count(413, "too_large", started)
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "the call carried no message")
            return None
        try:
            if len(message) > OFFLOAD_BYTES:
                request = await asyncio.to_thread(deserialize, message)
            else:
                request = deserialize(message)
        except DecodeError:
            count(400, None, started)
            request = None
        del message
        if request is None:
            refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the message is not a valid {SERVICE}/{name} request",
            )
            return None
        return await behavior(request, context)

    return handler
