"""The observability flags: OpenTelemetry traces (``--otlp-endpoint``, ``--otlp-protocol``,
``--trace-rate``, beside the ``OTEL_*`` variables) and the log (``--log-level``,
``--log-format``). ``/metrics`` is always served; where is a serving flag
(``--metrics-port``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TypedDict

from batching.tracing.tracing_config import TracingConfig, tracing_config

from .flags import Parser, one_line

__all__ = ["Observability", "add_observability_flags", "read_observability"]


class Observability(TypedDict):
    """The traces and the log the flags ask for (fields of ServerSettings)."""

    tracing: TracingConfig | None
    log_level: str
    log_format: str


def add_observability_flags(parser: Parser) -> None:
    parser.flag(
        "--otlp-endpoint",
        help="send OpenTelemetry traces to this OTLP collector: http://HOST:4318 (OTLP/HTTP, "
        "/v1/traces added when the URL has no path) or grpc://HOST:4317 (gRPC); unset: "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else tracing is "
        "off (docs/tracing.md)",
    )
    parser.flag(
        "--otlp-protocol",
        help="grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "
        "OTEL_EXPORTER_OTLP_PROTOCOL, else the endpoint's scheme: grpc:// or port 4317 is "
        "gRPC, http(s):// is OTLP/HTTP)",
    )
    parser.flag(
        "--trace-rate",
        help="the fraction of new traces kept, 0 to 1; a request whose traceparent says "
        "sampled or not is kept or not as its caller decided (default: OTEL_TRACES_SAMPLER "
        "and OTEL_TRACES_SAMPLER_ARG, else 1: every request)",
    )
    parser.flag("--log-level", default="info", help="debug, info, warning or error")
    parser.flag(
        "--log-format", default="text", choices=("text", "json"), help="log lines as text or JSON"
    )


def read_observability(args: argparse.Namespace, environ: Mapping[str, str]) -> Observability:
    """The observability flags, with the ``OTEL_*`` variables of ``environ``.

    :raises BadSetting: a tracing value that cannot be used, naming it.
    """
    with one_line():
        tracing = tracing_config(args.otlp_endpoint, args.otlp_protocol, args.trace_rate, environ)
    return Observability(
        tracing=tracing, log_level=str(args.log_level), log_format=str(args.log_format)
    )
