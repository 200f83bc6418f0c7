"""What tracing is asked for: the OTLP endpoint, its protocol and the sampler, from the flags
and the standard ``OTEL_*`` variables, checked at start-up (pure: no OpenTelemetry import).

Tracing is on when an endpoint is given: ``--otlp-endpoint`` (``BATCHING_OTLP_ENDPOINT``), or
else the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, as
any OpenTelemetry SDK reads them (``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
turn the variables' endpoint off; the flag still turns tracing on).

The protocol: ``--otlp-protocol``, else ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else
``OTEL_EXPORTER_OTLP_PROTOCOL``, else the URL's scheme: ``grpc://`` or ``grpcs://`` is gRPC,
``http://`` or ``https://`` is OTLP/HTTP (protobuf), except on port 4317, OTLP's gRPC port.

The sampler: ``--trace-rate R`` samples a fraction R of the traces that start here, and
follows the caller's decision when its ``traceparent`` has one (parent-based ratio); without
the flag ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` decide, and by default every
request is traced (``parentbased_always_on``, the SDK's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "PROTOCOLS",
    "SAMPLERS",
    "TracingConfig",
    "TracingConfigError",
    "tracing_config",
]

#: The OTLP protocols the server exports with (the OTel names).
PROTOCOLS = ("grpc", "http/protobuf")

#: The standard ``OTEL_TRACES_SAMPLER`` names.
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)

_OTLP_GRPC_PORT = 4317
_TRACES_PATH = "/v1/traces"


class TracingConfigError(ValueError):
    """A tracing setting that cannot be used; the message is one line naming it."""


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """Where spans go and which are kept."""

    #: The exporter's URL: for OTLP/HTTP the full traces URL (``.../v1/traces``), for gRPC
    #: ``http(s)://host:port`` (``http`` is plaintext).
    endpoint: str
    #: ``grpc`` or ``http/protobuf``.
    protocol: str
    #: The sampler's standard name (:data:`SAMPLERS`) and its ratio (ratio samplers only).
    sampler: str = "parentbased_always_on"
    ratio: float = 1.0
    #: The ``service.name`` of the spans (``OTEL_SERVICE_NAME``, or ``service.name`` in
    #: ``OTEL_RESOURCE_ATTRIBUTES``, win over it, as the SDK reads them).
    service_name: str = "batching"


def _ratio(text: str, where: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"{where} must be a number from 0 to 1, not {text!r}")
    return ratio


def _protocol(text: str, where: str) -> str:
    protocol = text.strip().lower()
    if protocol not in PROTOCOLS:
        raise TracingConfigError(f"{where} must be grpc or http/protobuf, not {text!r}")
    return protocol


def _is_on(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"


def _endpoint(url: str, protocol: str | None, where: str, *, full: bool) -> tuple[str, str]:
    """The exporter's URL and protocol for ``url``. ``full``: an HTTP URL is used as given
    (``..._TRACES_ENDPOINT``); otherwise ``/v1/traces`` is added to a URL without a path."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https", "grpc", "grpcs") or not parts.hostname:
        raise TracingConfigError(
            f"{where} must be a URL such as http://127.0.0.1:4318 (OTLP/HTTP) or "
            f"grpc://127.0.0.1:4317, not {url!r}"
        )
    try:
        port = parts.port
    except ValueError:
        raise TracingConfigError(f"{where} has no valid port: {url!r}") from None
    if parts.username or parts.password or parts.query or parts.fragment:
        raise TracingConfigError(
            f"{where} must not carry credentials, a query or a fragment "
            "(send headers with OTEL_EXPORTER_OTLP_HEADERS)"
        )
    if protocol is None:
        grpc = parts.scheme in ("grpc", "grpcs") or port == _OTLP_GRPC_PORT
        protocol = "grpc" if grpc else "http/protobuf"
    secure = parts.scheme in ("https", "grpcs")
    scheme = "https" if secure else "http"
    if protocol == "grpc":
        return urlunsplit((scheme, parts.netloc, "", "", "")), protocol
    path = parts.path
    if not full and path in ("", "/"):
        path = _TRACES_PATH
    elif not full:
        path = path.rstrip("/") + _TRACES_PATH if not path.endswith(_TRACES_PATH) else path
    return urlunsplit((scheme, parts.netloc, path, "", "")), protocol


def tracing_config(
    endpoint: str | None,
    protocol: str | None,
    rate: str | None,
    environ: Mapping[str, str],
) -> TracingConfig | None:
    """The tracing asked for by ``--otlp-endpoint``, ``--otlp-protocol`` and ``--trace-rate``
    (None when not given) and the ``OTEL_*`` variables in ``environ``; None: tracing is off.

    :raises TracingConfigError: a value that cannot be used, in one line naming it.
    """
    asked_protocol: str | None = None
    if protocol:
        asked_protocol = _protocol(protocol, "--otlp-protocol")
    else:
        for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            if environ.get(name, "").strip():
                asked_protocol = _protocol(environ[name], name)
                break
    if endpoint:
        url, chosen = _endpoint(endpoint, asked_protocol, "--otlp-endpoint", full=False)
    elif _is_on(environ) and environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        url, chosen = _endpoint(environ[name], asked_protocol, name, full=True)
    elif _is_on(environ) and environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        name = "OTEL_EXPORTER_OTLP_ENDPOINT"
        url, chosen = _endpoint(environ[name], asked_protocol, name, full=False)
    else:
        if rate is not None:
            _ratio(rate, "--trace-rate")  # still checked: a typo is not silently ignored
        return None
    if rate is not None:
        sampler, ratio = "parentbased_traceidratio", _ratio(rate, "--trace-rate")
    else:
        sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
        if sampler not in SAMPLERS:
            raise TracingConfigError(
                f"OTEL_TRACES_SAMPLER must be one of {', '.join(SAMPLERS)}, not {sampler!r}"
            )
        ratio = 1.0
        argument = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        if sampler.endswith("traceidratio") and argument:
            ratio = _ratio(argument, "OTEL_TRACES_SAMPLER_ARG")
    return TracingConfig(endpoint=url, protocol=chosen, sampler=sampler, ratio=ratio)
