"""What a connection may take, and how many there may be: the limits of every door.

:mod:`batching.http.connections` enforces them on HTTP (in uvicorn's protocol), and the gRPC
door applies the same values as grpc-core options (:mod:`batching.grpc.limits`). This module
is only the values, checked: it imports no uvicorn, so the settings that read them from flags
do not depend on the server's protocol.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ConnectionLimits"]


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connection may take, and how many there may be. Seconds; 0 turns one off."""

    #: From a request's first byte (or the connection's start) until its headers are in.
    header_timeout: float = 10.0
    #: Longest gap between two reads of a body that is still arriving.
    body_timeout: float = 10.0
    #: An idle kept-alive connection is closed after this long.
    keep_alive_timeout: float = 5.0
    #: Most open connections; beyond it a new one gets 503 and is closed. 0: no cap.
    max_connections: int = 4096
    #: After answering before the request was all read, the longest to drain it before closing.
    linger: float = 5.0
    #: Most bytes of a request line and headers together; beyond it, 431. 0: no limit.
    max_header_bytes: int = 65536
    #: Most header lines in a request; beyond it, 431. 0: no limit.
    max_header_count: int = 100
    #: From the end of the headers until the body's last byte; past it, 408. 0: never.
    body_deadline: float = 30.0
    #: Connections beyond ``max_connections`` taken for one probe request each.
    probe_connections: int = 8

    def __post_init__(self) -> None:
        # Every field but max_header_bytes (below) is a count or seconds, where 0 is "off".
        for field in dataclasses.fields(self):
            if field.name != "max_header_bytes" and getattr(self, field.name) < 0:
                raise ValueError(f"{field.name} must be >= 0")
        if self.max_header_bytes and self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be 0 (no limit) or >= 1024")
