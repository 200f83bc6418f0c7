"""What the gRPC door bounds, and the grpc-core options that bound it: the same limits as HTTP's.

grpc-core enforces each of these itself, in C, before a call reaches Python (measured with
grpcio 1.85; ``tests/grpc/test_grpc_limits.py`` checks every one against a real server):

- ``grpc.max_receive_message_length`` (``--max-body-bytes``): a larger message is refused with
  ``RESOURCE_EXHAUSTED`` from its 5-byte length prefix, before it is buffered; a compressed one
  is inflated no further than the limit ("Decompressed message larger than max"), so 0.5 MiB of
  gzip cannot become 512 MiB in the server.
- ``grpc.max_allowed_incoming_connections`` (``--max-connections``): a connection beyond it is
  accepted and closed at once (the client sees ``UNAVAILABLE``), so idle sockets cannot take
  every file descriptor. The count is gRPC's own: grpc-core does not expose it to Python, so
  this port and the HTTP port each have a cap of ``--max-connections``, and ``server.py``
  raises the open-file limit to hold both (a flood on one port never takes the other's room).
- ``grpc.max_metadata_size`` and ``grpc.absolute_max_metadata_size`` (``--max-header-bytes``,
  both alike so that every call over it is refused, not a random share): a call whose
  metadata (HTTP/2 headers) is larger is refused with ``RESOURCE_EXHAUSTED``, as HTTP answers
  431; 0, no limit on HTTP, is no limit here either.
- ``grpc.server_handshake_timeout_ms`` (``--header-timeout-s``): a connection that has not sent
  HTTP/2's preface and settings by then is closed, as HTTP closes one whose headers never come.
- ``grpc.max_connection_idle_ms`` (``--keep-alive-timeout-s``): a connection without a call for
  that long is sent GOAWAY and closed; a client reconnects on its next call.
- ``grpc.max_concurrent_streams``: calls one connection may have open at once
  (:data:`MAX_CONCURRENT_STREAMS`, HTTP/2's own setting: clients queue the rest).
- keepalive pings: a client may ping no more often than every :data:`MIN_PING_INTERVAL_MS`
  (with or without calls); after :data:`MAX_PING_STRIKES` faster ones the connection is closed
  with GOAWAY ``too_many_pings``. The server pings a connection with calls in flight every
  :data:`KEEPALIVE_TIME_MS` to find peers that vanished.

What grpc-core has no option for is done per call in :mod:`.calls`: a call whose message does
not arrive within ``--body-timeout-s`` is answered ``DEADLINE_EXCEEDED``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "INT32_MAX",
    "KEEPALIVE_TIME_MS",
    "KEEPALIVE_TIMEOUT_MS",
    "MAX_CONCURRENT_STREAMS",
    "MAX_PING_STRIKES",
    "MIN_PING_INTERVAL_MS",
    "GrpcLimits",
]

#: Calls one HTTP/2 connection may carry at once (Triton's and grpc-go's common choice).
MAX_CONCURRENT_STREAMS = 128

#: The shortest interval between a client's keepalive pings that is not a strike (ms).
MIN_PING_INTERVAL_MS = 10_000

#: Pings sent faster than :data:`MIN_PING_INTERVAL_MS` tolerated before GOAWAY.
MAX_PING_STRIKES = 2

#: How often the server pings a connection with calls in flight, and how long it waits (ms).
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000

#: The largest message gRPC can express; responses may be as large as this.
INT32_MAX = 2**31 - 1


def _ms(seconds: float) -> int:
    """Seconds as grpc-core's milliseconds; 0 (off) as its "never" (INT32_MAX)."""
    return INT32_MAX if seconds <= 0 else max(1, min(INT32_MAX, round(seconds * 1000)))


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """The gRPC door's limits, in HTTP's units (bytes, seconds; 0 turns a timeout or the cap
    off, as on HTTP)."""

    #: Largest message (``--max-body-bytes``), compressed or not.
    max_message_bytes: int = 1 << 20
    #: Most open gRPC connections (``--max-connections``); 0: no cap.
    max_connections: int = 4096
    #: A connection must finish HTTP/2's handshake within this (``--header-timeout-s``).
    handshake_timeout: float = 10.0
    #: A call's message must arrive within this of the call's start (``--body-timeout-s``).
    message_timeout: float = 10.0
    #: A connection with no call is closed after this (``--keep-alive-timeout-s``).
    idle_timeout: float = 5.0
    #: Largest metadata of a call (``--max-header-bytes``); 0: no limit, as on HTTP.
    max_metadata_bytes: int = 65536

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1:
            raise ValueError("max_message_bytes must be >= 1")
        if self.max_connections < 0:
            raise ValueError("max_connections must be >= 0")
        if self.max_metadata_bytes < 0:
            raise ValueError("max_metadata_bytes must be >= 0")
        for name in ("handshake_timeout", "message_timeout", "idle_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def server_options(self) -> list[tuple[str, int]]:
        """The ``grpc.aio.server`` options that enforce these limits (see the module's text)."""
        options = [
            ("grpc.max_receive_message_length", min(self.max_message_bytes, INT32_MAX)),
            ("grpc.max_send_message_length", INT32_MAX),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_timeout)),
            ("grpc.max_connection_idle_ms", _ms(self.idle_timeout)),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
            ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            # Never share the port: a second server would take half of the first one's calls.
            ("grpc.so_reuseport", 0),
        ]
        if self.max_connections:
            options.append(("grpc.max_allowed_incoming_connections", self.max_connections))
        # 0 means no limit, as on HTTP: grpc-core's own default (8 KiB) would be stricter.
        size = min(self.max_metadata_bytes or INT32_MAX, INT32_MAX)
        options.append(("grpc.max_metadata_size", size))
        options.append(("grpc.absolute_max_metadata_size", size))
        return options
