"""API keys on the gRPC door: a ``grpc.aio`` server interceptor in front of every RPC.

When keys are set, every RPC needs one in its metadata (``authorization: Bearer KEY``, which
tritonclient sends through its ``headers=`` argument, or ``api-key: KEY``) except the two health
RPCs, ``ServerLive`` and ``ServerReady``, which stay open as ``/v2/health/live`` and
``/v2/health/ready`` do on HTTP. A call without a valid key ends with ``UNAUTHENTICATED``
(never ``UNAVAILABLE``, which clients and proxies retry) before the servicer runs and without
parsing its request message: it costs no model time. The key is never logged or echoed; each
refusal is counted (``on_refused``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

import grpc

from batching.answers import answer_log
from batching.keys import KeyCheck, credential_of

from .calls import refuse

__all__ = ["MESSAGE", "OPEN_METHODS", "ApiKeyInterceptor", "presented_key"]

_SERVICE = "/inference.GRPCInferenceService/"

#: RPCs that answer without a key: the health checks, as the HTTP probes.
OPEN_METHODS = frozenset({_SERVICE + "ServerLive", _SERVICE + "ServerReady"})

MESSAGE = "a valid API key is required: metadata authorization: Bearer KEY"


def presented_key(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The key a call's metadata presents (:func:`batching.keys.credential_of`), if any;
    binary (``-bin``) values are never one."""
    return credential_of(
        (str(key).lower(), value if isinstance(value, str) else "") for key, value in metadata or ()
    )


async def _refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
    # Sets the status and returns: ``context.abort`` would raise an exception that grpc keeps
    # with the call's frames until a full garbage collection (see .calls).
    refuse(context, grpc.StatusCode.UNAUTHENTICATED, MESSAGE)


def _refusal(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler that refuses at once, taking its request as a stream it never reads (the
    wire is the same for either kind): the request message is never read whole or parsed,
    whatever the method, known (``handler``) or not (None)."""
    if handler is not None and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse)
    return grpc.stream_unary_rpc_method_handler(_refuse)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Ends every RPC outside ``open_methods`` that presents no key ``keys`` accepts (an API
    key or an admin key: :class:`batching.keys.AccessKeys`) with ``UNAUTHENTICATED``; counts
    each refusal with ``on_refused``."""

    def __init__(
        self,
        keys: KeyCheck,
        open_methods: Collection[str] = OPEN_METHODS,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.keys = keys
        self.open_methods = frozenset(open_methods)
        self.on_refused = on_refused

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if method in self.open_methods:
            return handler
        if self.keys.accepts(presented_key(handler_call_details.invocation_metadata)):
            return handler
        if self.on_refused is not None:
            self.on_refused()
        answer_log.answered(f"gRPC call {method}", 401, "no valid API key")
        # An unknown method is refused as any other: it reveals nothing.
        return _refusal(handler)
