"""The gRPC server: ``grpc.aio`` on the app's event loop, into the same data plane as HTTP.

It binds with the same limits as HTTP (:mod:`.limits`: message size, connections, timeouts,
keepalive pings) and never shares its port: gRPC's default ``SO_REUSEPORT`` would let a second
server on the same port take half of the first one's calls, so a taken port is an error here,
as it is for HTTP. Each unary method reads its own message (:mod:`.calls`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence

import grpc

from batching.plane import DataPlane
from batching.tls import CertificateFiles

from .calls import SERVICE, method_handlers
from .limits import GrpcLimits
from .tls import server_credentials
from .v2 import InferenceServicer

__all__ = ["GrpcServer", "GrpcUnavailable"]

logger = logging.getLogger("batching")


class GrpcUnavailable(OSError):
    """Raised when a gRPC port that was asked for cannot be bound."""


def address_of(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind_error(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on, or None when it can (checked with a plain
    socket first, so a taken port is one clear line, not gRPC's own log of the failure)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return exc
    for family, kind, protocol, _, address in infos:
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC's own listener: a port in TIME_WAIT after a previous server is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                probe.listen()
            except OSError as exc:
                return exc
    return None


class GrpcServer:
    """KServe v2 over gRPC on ``host:port``, serving ``plane``.

    :param limits: message size, connections and timeouts (HTTP's, see :mod:`.limits`).
    :param explicit: whether the port was asked for. If so, a port that cannot be bound is
        an error: ``on_failure`` is told why, or :meth:`start` raises
        :class:`GrpcUnavailable`. If not (a default), the server logs one line and stays off,
        so that several servers on one machine need no flag but HTTP's.
    :param tls: serve TLS (and mutual TLS) with these certificates, re-read for new
        connections when their files change (:mod:`batching.grpc.tls`); None: plaintext.
    :param interceptors: ``grpc.aio.ServerInterceptor`` s every call passes, in order (the
        API key check, :mod:`.auth`).
    :param servicer: builds the servicer over ``plane`` (with model control and the log
        settings, :mod:`.control`).
    """

    def __init__(
        self,
        plane: DataPlane,
        host: str,
        port: int,
        *,
        limits: GrpcLimits | None = None,
        explicit: bool = True,
        on_failure: Callable[[str], None] | None = None,
        tls: CertificateFiles | None = None,
        interceptors: Sequence[object] = (),
        servicer: Callable[[DataPlane], InferenceServicer] = InferenceServicer,
    ) -> None:
        self.plane = plane
        self.make_servicer = servicer
        self.tls = tls
        self.host = host
        self.port = port
        self.limits = limits if limits is not None else GrpcLimits()
        self.explicit = explicit
        self.on_failure = on_failure
        self.interceptors = list(interceptors)
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return address_of(self.host, self.port)

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Bind and start taking calls, on the running event loop.

        :raises GrpcUnavailable: an explicit port cannot be bound and nobody is told.
        """
        problem = _bind_error(self.host, self.port)
        if problem is not None:
            self._refuse(problem)
            return
        server = grpc.aio.server(
            options=self.limits.server_options(), interceptors=self.interceptors or None
        )
        servicer = self.make_servicer(self.plane)
        handlers = method_handlers(
            servicer, message_timeout=self.limits.message_timeout, count=servicer.count_refused
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)
        try:
            if self.tls is None:
                server.add_insecure_port(self.address)
            else:
                server.add_secure_port(self.address, server_credentials(self.tls))
        except RuntimeError as exc:  # taken between the check and the bind
            self._refuse(OSError(str(exc)))
            return
        await server.start()
        self._server = server
        logger.info(
            "serving KServe v2 over gRPC%s on %s",
            "" if self.tls is None else " with TLS",
            self.address,
        )

    def _refuse(self, problem: OSError) -> None:
        reason = problem.strerror or str(problem)
        if not self.explicit:
            logger.warning(
                "gRPC is off: its default port %s cannot be bound (%s); serving HTTP only. "
                "--grpc-port picks another port, 0 turns gRPC off",
                self.address,
                reason,
            )
            return
        message = (
            f"cannot serve gRPC on {self.address}: {reason} (--grpc-port picks another port, "
            "0 turns gRPC off)"
        )
        if self.on_failure is None:
            raise GrpcUnavailable(message)
        self.on_failure(message)

    def begin_stop(self, grace: float) -> None:
        """Stop taking calls now; those accepted have ``grace`` seconds to finish, then are
        cancelled. Idempotent: :meth:`stop` waits for the same stop."""
        if self._server is not None and self._stopping is None:
            self._stopping = asyncio.ensure_future(self._server.stop(grace))

    async def stop(self, grace: float) -> None:
        """:meth:`begin_stop`, and wait until every call has ended."""
        self.begin_stop(grace)
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
