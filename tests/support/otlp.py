"""OTLP receivers on 127.0.0.1 built from ``opentelemetry-proto``: what a collector receives.

:class:`HttpReceiver` takes OTLP/HTTP (``POST /v1/traces``, an ``ExportTraceServiceRequest``
in protobuf), :class:`GrpcReceiver` the gRPC ``TraceService/Export``; both keep every span
they were sent, with its resource's ``service.name``.
"""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["GrpcReceiver", "HttpReceiver", "Received", "attributes_of"]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def attributes_of(holder: Any) -> dict[str, Any]:
    """A span's (or event's, or resource's) attributes as a dict."""
    return {attribute.key: _value(attribute.value) for attribute in holder.attributes}


@dataclass
class Received:
    """Every span received so far, as protobuf ``Span`` messages, and the service names."""

    def __post_init__(self) -> None:
        self.spans: list[Any] = []
        self.services: set[str] = set()
        self._changed = threading.Condition()

    def add(self, request: Any) -> None:
        with self._changed:
            for resource_spans in request.resource_spans:
                service = attributes_of(resource_spans.resource).get("service.name")
                self.services.add(str(service))
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Any]:
        """The spans, once at least ``count`` have arrived."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.spans) >= count, timeout):
                raise AssertionError(f"{len(self.spans)} spans received, {count} expected")
            return list(self.spans)

    def named(self, prefix: str) -> list[Any]:
        with self._changed:
            return [span for span in self.spans if span.name.startswith(prefix)]


class HttpReceiver(Received):
    """An OTLP/HTTP receiver; :attr:`url` is its ``/v1/traces``."""

    def __init__(self) -> None:
        super().__init__()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.add(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class GrpcReceiver(Received):
    """An OTLP/gRPC receiver (``TraceService``); :attr:`url` is ``grpc://127.0.0.1:port``."""

    def __init__(self) -> None:
        super().__init__()
        received = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                received.add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.url = f"grpc://127.0.0.1:{port}"

    def __enter__(self) -> GrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(None)
