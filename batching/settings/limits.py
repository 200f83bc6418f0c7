"""The limit flags: how large a request may be (``--max-body-bytes``; an image's pixels and
decoding memory, an audio's seconds) and what a connection may take (timeouts, header size and
count, the connection cap and the probes' reserve), on every door."""

from __future__ import annotations

import argparse
from typing import TypedDict

from batching.http.limits import ConnectionLimits
from batching.models.media import DEFAULT_MAX_DECODE_BYTES, DEFAULT_MAX_IMAGE_PIXELS, MediaLimits
from batching.models.tasks.audio import DEFAULT_MAX_SECONDS

from .flags import Parser, one_line

__all__ = ["Limits", "add_limit_flags", "read_limits", "read_media_limits"]


class Limits(TypedDict):
    """What a request's body and a connection may take (fields of ServerSettings)."""

    max_body_bytes: int
    connections: ConnectionLimits


def add_limit_flags(parser: Parser) -> None:
    parser.flag("--max-body-bytes", default=1 << 20, help="largest request body (413 beyond)")
    parser.flag(
        "--max-image-pixels",
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="image inputs: most pixels (width x height) an image may have, read from its "
        "header before it is decoded (413 beyond)",
    )
    parser.flag(
        "--max-decode-bytes",
        default=DEFAULT_MAX_DECODE_BYTES,
        help="image inputs: most memory one image may take to decode and prepare for the "
        "model, estimated from its header before it is decoded (413 beyond)",
    )
    parser.flag(
        "--max-audio-seconds",
        default=DEFAULT_MAX_SECONDS,
        help="audio inputs: the longest audio in seconds, read from a file's header before it "
        "is decoded (413 beyond)",
    )
    _add_connection_flags(parser)


def _add_connection_flags(parser: Parser) -> None:
    limits = ConnectionLimits()
    parser.flags(
        [
            (
                "--header-timeout-s",
                limits.header_timeout,
                "a connection whose request headers are not all in after this long (from its "
                "first byte, or from the connection's start) gets 408 and is closed; 0: never",
            ),
            (
                "--body-timeout-s",
                limits.body_timeout,
                "longest wait between two reads of a request body still arriving; past it, "
                "408 and close; 0: never",
            ),
            (
                "--keep-alive-timeout-s",
                limits.keep_alive_timeout,
                "an idle keep-alive connection is closed after this long",
            ),
            (
                "--max-connections",
                limits.max_connections,
                "most open connections on each port (HTTP and gRPC); an HTTP connection beyond it "
                "is answered 503 at once and closed, a gRPC one is closed (UNAVAILABLE); "
                "0: no cap",
            ),
            (
                "--max-header-bytes",
                limits.max_header_bytes,
                "most bytes of an HTTP request line and headers together, counted as they "
                "arrive; beyond it, 431 and close without reading the rest; 0: no limit",
            ),
            (
                "--max-header-count",
                limits.max_header_count,
                "most header lines in an HTTP request; beyond it, 431 and close; 0: no limit",
            ),
            (
                "--body-deadline-s",
                limits.body_deadline,
                "from the end of a request's headers until its body's last byte, however "
                "steadily it trickles in; past it, 408 and close; 0: never",
            ),
            (
                "--probe-connections",
                limits.probe_connections,
                "connections taken beyond --max-connections for one liveness or readiness "
                "probe each (/v2/health/live, /v2/health/ready; any other request: 503); a silent "
                "one is closed after 1 s, or when a newer one needs its slot",
            ),
        ]
    )


def read_media_limits(args: argparse.Namespace) -> MediaLimits:
    """The media limits every model of the start takes by default (checked by its
    configuration)."""
    return MediaLimits(
        max_image_pixels=int(args.max_image_pixels),
        max_audio_seconds=float(args.max_audio_seconds),
        max_decode_bytes=int(args.max_decode_bytes),
    )


def read_limits(args: argparse.Namespace) -> Limits:
    """The body and connection limits, checked.

    :raises BadSetting: a negative timeout or count, or a header limit under 1 KiB.
    """
    with one_line():
        connections = ConnectionLimits(
            header_timeout=float(args.header_timeout_s),
            body_timeout=float(args.body_timeout_s),
            keep_alive_timeout=float(args.keep_alive_timeout_s),
            max_connections=int(args.max_connections),
            max_header_bytes=int(args.max_header_bytes),
            max_header_count=int(args.max_header_count),
            body_deadline=float(args.body_deadline_s),
            probe_connections=int(args.probe_connections),
        )
    return Limits(max_body_bytes=int(args.max_body_bytes), connections=connections)
