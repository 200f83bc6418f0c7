"""The serving flags: where the server listens (``--host``, ``--port``, ``--grpc-port``,
``--metrics-port``), how long it drains on SIGTERM (``--shutdown-timeout-s``) and what it does
to the process's allocator (``--malloc``)."""

from __future__ import annotations

import argparse
from typing import TypedDict

from .flags import Parser, fail

__all__ = ["DEFAULT_GRPC_PORT", "Serving", "add_serving_flags", "read_serving"]

#: Triton's gRPC port.
DEFAULT_GRPC_PORT = 8001


class Serving(TypedDict):
    """Where the server listens, and how it runs as a process (fields of ServerSettings)."""

    host: str
    port: int
    #: KServe v2 over gRPC on ``host``; 0 when off.
    grpc_port: int
    #: Whether ``grpc_port`` was asked for (flag or variable) rather than left at its default.
    grpc_port_explicit: bool
    #: A second listener on ``host`` for ``/metrics`` and the probes; None: the main port.
    metrics_port: int | None
    shutdown_timeout: float
    malloc: str


def add_serving_flags(parser: Parser) -> None:
    parser.flag("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 for all")
    parser.flag("--port", default=8000, help="port to bind")
    # No default here, so that an asked-for port can be told from the default one.
    parser.flag(
        "--grpc-port",
        type=int,
        help=f"port for KServe v2 over gRPC on the same host (default: {DEFAULT_GRPC_PORT}, as "
        "Triton; taken, the server serves HTTP only and says so); 0 turns gRPC off",
    )
    parser.flag(
        "--metrics-port",
        type=int,
        help="serve /metrics (and the health probes) on this port of --host instead of the "
        "main port, so it can be firewalled apart (default: /metrics on the main port)",
    )
    parser.flag(
        "--shutdown-timeout-s",
        default=30.0,
        help="on SIGTERM, how long accepted requests may take to finish",
    )
    parser.flag(
        "--malloc",
        default="auto",
        choices=("auto", "off"),
        help="auto: server.py fixes glibc's mmap threshold and caps its arenas "
        "(batching/runtime/allocator.py), so resident memory stays flat under mixed request "
        "sizes; off: leave the allocator as it is (MALLOC_* variables still apply)",
    )


def read_serving(args: argparse.Namespace) -> Serving:
    """The serving flags, checked.

    :raises BadSetting: a gRPC port out of range, or a metrics port that is not a port of its
        own.
    """
    port = int(args.port)
    grpc_port = DEFAULT_GRPC_PORT if args.grpc_port is None else int(args.grpc_port)
    if not 0 <= grpc_port <= 65535:
        fail(f"--grpc-port must be a port number, or 0 to turn gRPC off: {grpc_port}")
    metrics_port = None if args.metrics_port is None else int(args.metrics_port)
    if metrics_port is not None and not (
        1 <= metrics_port <= 65535 and metrics_port not in (port, grpc_port)
    ):
        fail(
            "--metrics-port must be a port number other than --port and --grpc-port: "
            f"{metrics_port}"
        )
    return Serving(
        host=str(args.host),
        port=port,
        grpc_port=grpc_port,
        grpc_port_explicit=args.grpc_port is not None,
        metrics_port=metrics_port,
        shutdown_timeout=float(args.shutdown_timeout_s),
        malloc=str(args.malloc),
    )
