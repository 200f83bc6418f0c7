"""OpenTelemetry traces, received by a real OTLP receiver on 127.0.0.1 (built from
``opentelemetry-proto``): the SDK's exporter sends what the server made, and the tests read
the spans as a collector would.

- every request has a server span parented on the caller's ``traceparent`` (HTTP header,
  gRPC metadata), with the model, items, outcome and times;
- a batch of 16 concurrent requests is one batch span linked to all 16 request spans;
- refused (401, 404, 413, 503) and disconnected requests end their span with the reason;
- the settings (flags, ``OTEL_*`` variables) and their one-line errors; with tracing off,
  OpenTelemetry is never imported.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from batching import BatchingConfig, ModelConfig, create_app
from batching.keys import ApiKeys
from batching.settings.cli import parse_settings
from batching.tracing.tracing_config import TracingConfig, TracingConfigError, tracing_config
from tests.support.asgi import app_with, echo_config, serving
from tests.support.grpc_door import serving_grpc
from tests.support.models import EchoModel, GatedModel, SlowLoadModel
from tests.support.otlp import GrpcReceiver, HttpReceiver, Received, attributes_of
from tests.support.servers import free_port, running

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def traceparent() -> tuple[str, bytes, bytes]:
    """A sampled W3C ``traceparent`` of a new trace, and its trace and parent span ids."""
    trace_id, parent_id = secrets.token_bytes(16), secrets.token_bytes(8)
    return f"00-{trace_id.hex()}-{parent_id.hex()}-01", trace_id, parent_id


def http_tracing(receiver: HttpReceiver) -> TracingConfig:
    return TracingConfig(endpoint=receiver.url, protocol="http/protobuf")


def server_spans(receiver: Received, name: str) -> list[Any]:
    return [span for span in receiver.named(name) if span.kind == span.SPAN_KIND_SERVER]


async def test_sixteen_concurrent_requests_are_one_batch_span_linked_to_their_spans() -> None:
    # The batch goes out when 16 items are queued (a long window, and a cap of 16).
    config = echo_config(max_batch_size=16, max_queue_delay=20.0, timeout=25.0)
    with HttpReceiver() as receiver:
        app = app_with(EchoModel(), config, tracing=http_tracing(receiver))
        sent = [traceparent() for _ in range(16)]
        async with serving(app) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/", content=f"text {i}".encode(), headers={"traceparent": tp})
                    for i, (tp, _, _) in enumerate(sent)
                )
            )
            assert [answer.status_code for answer in answers] == [200] * 16
        # The app's shutdown flushed every span to the receiver.
        requests = server_spans(receiver, "POST")
        by_trace = {span.trace_id: span for span in requests}
        assert len(requests) == 16 and len(by_trace) == 16
        for _, trace_id, parent_id in sent:
            span = by_trace[trace_id]
            assert span.parent_span_id == parent_id  # a child of the caller's span
            attributes = attributes_of(span)
            assert span.name == "POST /"
            assert attributes["http.route"] == "/"
            assert attributes["http.response.status_code"] == 200
            assert attributes["batching.model"] == "echo"
            assert attributes["batching.items"] == 1
            assert attributes["batching.batches"] == 1
            assert attributes["batching.queue_seconds"] >= 0
            assert attributes["batching.compute_seconds"] >= 0
            assert "batching.reason" not in attributes
            assert attributes["batching.batched_seconds"] >= 0
            assert span.status.code != span.status.STATUS_CODE_ERROR
        (batch,) = receiver.named("batch echo")
        assert batch.parent_span_id == b""  # a root: its requests are its links
        linked = {(link.trace_id, link.span_id) for link in batch.links}
        assert linked == {(span.trace_id, span.span_id) for span in requests}
        attributes = attributes_of(batch)
        assert attributes["batching.batch.size"] == 16
        assert attributes["batching.batch.requests"] == 16
        assert attributes["batching.batch.release_reason"] == "full"
        assert attributes["batching.instance"] == "echo-0"
        assert attributes["batching.instance.kind"] == "thread"
        assert attributes["batching.engine"] == "python"
        assert attributes["batching.batch.padded_tokens"] == 0  # not batched by tokens
        assert batch.start_time_unix_nano <= batch.end_time_unix_nano
        assert receiver.services == {"batching"}


async def test_refused_requests_end_their_spans_with_the_reason() -> None:
    keys = ApiKeys(["secret-key"])
    auth = {"authorization": "Bearer secret-key"}
    v2_body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}
    with HttpReceiver() as receiver:
        app = app_with(
            EchoModel(), tracing=http_tracing(receiver), api_keys=keys, max_body_bytes=128
        )
        async with serving(app) as client:
            answers = [
                await client.post("/", content=b"hi", headers=_tp("401")),
                await client.post("/", content=b"x" * 200, headers=auth | _tp("413")),
                await client.post("/models/nope", content=b"hi", headers=auth | _tp("404")),
                await client.post("/v2/models/echo/infer", json=v2_body, headers=auth | _tp("v2")),
                await client.get("/v2/models/echo", headers=auth | _tp("meta")),
                await client.post("/v1/embeddings", json={"input": "x"}, headers=_tp("openai")),
            ]
        assert [answer.status_code for answer in answers] == [401, 413, 404, 200, 200, 401]
        spans = {
            attributes_of(span).get("batching.request_id"): attributes_of(span)
            for span in server_spans(receiver, "")
        }
    assert spans["req-401"]["http.response.status_code"] == 401
    assert spans["req-401"]["batching.reason"].startswith("a valid API key is required")
    assert spans["req-413"]["http.response.status_code"] == 413
    assert "over the 128-byte limit" in spans["req-413"]["batching.reason"]
    assert spans["req-413"]["batching.model"] == "echo"
    assert spans["req-404"]["http.response.status_code"] == 404
    assert "no model named 'nope'" in spans["req-404"]["batching.reason"]
    for refused in ("req-401", "req-413", "req-404"):
        assert "error.type" not in spans[refused]  # the caller's error, not the server's
    infer = spans["req-v2"]
    assert infer["http.route"] == "/v2/models/{model_name}/infer"
    assert infer["batching.items"] == 2 and infer["batching.model"] == "echo"
    assert spans["req-meta"]["http.request.method"] == "GET"
    # OpenAI's error document: the reason is its error.message.
    assert spans["req-openai"]["batching.reason"].startswith("a valid API key is required")


def _tp(seed: str) -> dict[str, str]:
    return {"traceparent": traceparent()[0], "x-request-id": f"req-{seed}"}


async def test_a_request_refused_while_the_model_loads_ends_its_span_503() -> None:
    model = SlowLoadModel()
    with HttpReceiver() as receiver:
        app = app_with(model, tracing=http_tracing(receiver))
        async with serving(app, wait_ready=False) as client:
            answer = await client.post("/", content=b"hi", headers=_tp("loading"))
            assert answer.status_code == 503
            model.loaded.set()
        (span,) = [s for s in server_spans(receiver, "POST") if s.name.startswith("POST")]
    attributes = attributes_of(span)
    assert attributes["http.response.status_code"] == 503
    assert "is not ready" in attributes["batching.reason"]
    assert attributes["error.type"] == "503"
    assert span.status.code == span.status.STATUS_CODE_ERROR


class Ended(SpanProcessor):
    """Sets :attr:`event` when a span of ``trace_id`` ends (added to the app's provider)."""

    def __init__(self, trace_id: bytes) -> None:
        self.trace_id = int.from_bytes(trace_id, "big")
        self.event = threading.Event()

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_id == self.trace_id:
            self.event.set()


async def test_a_disconnected_request_ends_its_span_with_the_reason() -> None:
    model = GatedModel()
    config = echo_config(max_batch_size=1)
    tp, trace_id, _ = traceparent()
    ended = Ended(trace_id)
    with HttpReceiver() as receiver:
        app = app_with(model, config, tracing=http_tracing(receiver))
        app.state.tracing.provider.add_span_processor(ended)
        async with running(app) as url:
            async with httpx.AsyncClient(base_url=url) as client:
                call = asyncio.create_task(
                    client.post("/", content=b"hang up", headers={"traceparent": tp})
                )
                assert await asyncio.to_thread(model.entered.wait, 10)
                call.cancel()  # the client hangs up while its batch runs
                with pytest.raises(asyncio.CancelledError):
                    await call
            assert await asyncio.to_thread(ended.event.wait, 10)
            model.gate.set()
        (span,) = [span for span in receiver.spans if span.trace_id == trace_id]
    attributes = attributes_of(span)
    assert attributes["http.response.status_code"] == 499
    assert attributes["batching.reason"] == "the client disconnected before its answer"
    # The batch it was in still ran, and links to it.
    (batch,) = receiver.named("batch echo")
    assert [link.span_id for link in batch.links] == [span.span_id]


async def test_an_unreachable_collector_neither_fails_requests_nor_holds_up_shutdown() -> None:
    with HttpReceiver() as receiver:
        gone = receiver.url  # a port nothing listens on once the receiver has closed
    app = app_with(
        EchoModel(),
        tracing=TracingConfig(endpoint=gone, protocol="http/protobuf"),
        shutdown_timeout=1.0,
    )
    async with serving(app) as client:
        answers = [await client.post("/", content=b"hi", headers=_tp(str(i))) for i in range(3)]
        assert [answer.status_code for answer in answers] == [200] * 3
    # The shutdown returned (within the test's timeout) with the spans undelivered.


# ------------------------------------------------------------------------------ the gRPC door


def text_input(texts: list[str]) -> Any:
    tensor = grpcclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


async def test_grpc_calls_are_parented_on_their_metadata_and_batched_with_links() -> None:
    """Over OTLP/gRPC this time: tritonclient sends ``traceparent`` as call metadata."""
    config = ModelConfig(
        name="vec",
        source="tests.support.models:VectorModel",
        batching=BatchingConfig(max_batch_size=4, max_queue_delay=0.05),
    )
    keys = ApiKeys(["secret-key"])
    with GrpcReceiver() as receiver:
        tracing = TracingConfig(endpoint=receiver.url.replace("grpc", "http"), protocol="grpc")
        async with serving_grpc(config, tracing=tracing, api_keys=keys) as (_, target):
            client = grpcclient.InferenceServerClient(target)
            sent = [traceparent() for _ in range(4)]
            try:
                await asyncio.gather(
                    *(
                        client.infer(
                            "vec",
                            [text_input([f"text {i}"])],
                            headers={"traceparent": tp, "authorization": "Bearer secret-key"},
                        )
                        for i, (tp, _, _) in enumerate(sent)
                    )
                )
                refused_tp, refused_trace, _ = traceparent()
                with pytest.raises(grpcclient.InferenceServerException) as unauthenticated:
                    await client.infer(
                        "vec", [text_input(["x"])], headers={"traceparent": refused_tp}
                    )
                assert "UNAUTHENTICATED" in str(unauthenticated.value.status())
                missing_tp, missing_trace, _ = traceparent()
                with pytest.raises(grpcclient.InferenceServerException):
                    await client.infer(
                        "nope",
                        [text_input(["x"])],
                        headers={"traceparent": missing_tp, "authorization": "Bearer secret-key"},
                    )
            finally:
                await client.close()
    calls = {span.trace_id: span for span in server_spans(receiver, "inference.")}
    for _, trace_id, parent_id in sent:
        span = calls[trace_id]
        assert span.name == "inference.GRPCInferenceService/ModelInfer"
        assert span.parent_span_id == parent_id
        attributes = attributes_of(span)
        assert attributes["rpc.system"] == "grpc"
        assert attributes["rpc.method"] == "ModelInfer"
        assert attributes["rpc.grpc.status_code"] == 0
        assert attributes["batching.model"] == "vec" and attributes["batching.items"] == 1
        assert "batching.queue_seconds" in attributes
    # Calls arrive over the network one by one: each is in exactly one batch, linked there.
    batches = receiver.named("batch vec")
    links = [link.span_id for batch in batches for link in batch.links]
    assert sorted(links) == sorted(calls[t].span_id for _, t, _ in sent)
    assert sum(attributes_of(batch)["batching.batch.size"] for batch in batches) == 4
    refused = attributes_of(calls[refused_trace])
    assert refused["rpc.grpc.status_code"] == 16  # UNAUTHENTICATED
    assert refused["batching.reason"].startswith("a valid API key is required")
    missing = attributes_of(calls[missing_trace])
    assert missing["rpc.grpc.status_code"] == 5  # NOT_FOUND
    assert "no model named 'nope'" in missing["batching.reason"]


async def test_a_cancelled_grpc_call_ends_its_span_with_the_reason() -> None:
    model = GatedModel()
    tp, trace_id, _ = traceparent()
    ended = Ended(trace_id)
    port = free_port()
    with HttpReceiver() as receiver:
        app = app_with(
            model, echo_config(max_batch_size=1), tracing=http_tracing(receiver), grpc_port=port
        )
        app.state.tracing.provider.add_span_processor(ended)
        async with running(app):
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                call = asyncio.create_task(
                    client.infer("echo", [text_input(["x"])], headers={"traceparent": tp})
                )
                assert await asyncio.to_thread(model.entered.wait, 10)
                call.cancel()  # the caller gives up while its batch runs
                with pytest.raises(asyncio.CancelledError):
                    await call
                assert await asyncio.to_thread(ended.event.wait, 10)
            finally:
                model.gate.set()
                await client.close()
        (span,) = [span for span in receiver.spans if span.trace_id == trace_id]
    attributes = attributes_of(span)
    assert attributes["batching.reason"] == "the call was cancelled"
    assert attributes["rpc.grpc.status_code"] == 1  # CANCELLED


# ------------------------------------------------------------------------- process instances


@pytest.mark.slow
async def test_a_process_instance_batch_span_is_made_in_the_server_process() -> None:
    config = ModelConfig(
        name="proc",
        source="tests.support.models:EchoModel",
        instance_kind="process",
        batching=BatchingConfig(max_batch_size=4, max_queue_delay=20.0, timeout=25.0),
    )
    with HttpReceiver() as receiver:
        app = create_app(config, tracing=http_tracing(receiver))
        async with serving(app) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/", content=b"x", headers={"traceparent": traceparent()[0]})
                    for _ in range(4)
                )
            )
            assert [answer.status_code for answer in answers] == [200] * 4
        requests = server_spans(receiver, "POST")
        (batch,) = receiver.named("batch proc")
    assert {link.span_id for link in batch.links} == {span.span_id for span in requests}
    attributes = attributes_of(batch)
    assert attributes["batching.instance"] == "proc-0"
    assert attributes["batching.instance.kind"] == "process"


# ---------------------------------------------------------------------------------- sampling


async def test_the_trace_rate_keeps_what_callers_sampled_and_samples_the_rest() -> None:
    """``--trace-rate 0``: a request whose caller sampled it is traced (and its batch), one
    whose caller did not, or that has no traceparent, is not."""
    config = echo_config(max_batch_size=3, max_queue_delay=20.0, timeout=25.0)
    with HttpReceiver() as receiver:
        tracing = tracing_config(receiver.url, None, "0", {})
        assert tracing is not None and tracing.sampler == "parentbased_traceidratio"
        app = app_with(EchoModel(), config, tracing=tracing)
        sampled, trace_id, _ = traceparent()
        unsampled = traceparent()[0][:-2] + "00"
        async with serving(app) as client:
            answers = await asyncio.gather(
                client.post("/", content=b"a", headers={"traceparent": sampled}),
                client.post("/", content=b"b", headers={"traceparent": unsampled}),
                client.post("/", content=b"c"),
            )
            assert [answer.status_code for answer in answers] == [200] * 3
        (request,) = server_spans(receiver, "POST")
        (batch,) = receiver.named("batch echo")
    assert request.trace_id == trace_id
    # All three requests are linked; only the sampled one was exported.
    assert len(batch.links) == 3
    assert request.span_id in {link.span_id for link in batch.links}


# ---------------------------------------------------------------------------------- settings


def test_the_flags_and_the_standard_variables_choose_endpoint_protocol_and_sampler() -> None:
    assert tracing_config(None, None, None, {}) is None
    assert parse_settings([], {}).tracing is None
    http = parse_settings(["--otlp-endpoint", "http://collector:4318"], {}).tracing
    assert http == TracingConfig("http://collector:4318/v1/traces", "http/protobuf")
    grpc_by_port = tracing_config("http://collector:4317", None, None, {})
    assert grpc_by_port == TracingConfig("http://collector:4317", "grpc")
    grpcs = tracing_config("grpcs://collector:443", None, "0.25", {})
    assert grpcs == TracingConfig("https://collector:443", "grpc", "parentbased_traceidratio", 0.25)
    environ = {
        "BATCHING_OTLP_ENDPOINT": "http://collector:4317",
        "BATCHING_OTLP_PROTOCOL": "http/protobuf",
        "BATCHING_TRACE_RATE": "0.5",
    }
    twins = parse_settings([], environ).tracing
    assert twins == TracingConfig(
        "http://collector:4317/v1/traces", "http/protobuf", "parentbased_traceidratio", 0.5
    )
    standard = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/otlp",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    }
    assert tracing_config(None, None, None, standard) == TracingConfig(
        "https://collector:4318/otlp/v1/traces", "http/protobuf", "traceidratio", 0.1
    )
    traces = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:9999/custom",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    assert tracing_config(None, None, None, traces) == TracingConfig(
        "http://collector:9999", "grpc"
    )
    traces["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    assert tracing_config(None, None, None, traces) == TracingConfig(
        "http://collector:9999/custom", "http/protobuf"
    )
    assert tracing_config(None, None, None, traces | {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing_config(None, None, None, traces | {"OTEL_TRACES_EXPORTER": "none"}) is None


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--otlp-endpoint", "collector:4318"], {}, "--otlp-endpoint must be a URL"),
        (["--otlp-endpoint", "http://a:b@c:4318"], {}, "must not carry credentials"),
        (["--otlp-endpoint", "http://c:99999"], {}, "has no valid port"),
        (["--otlp-endpoint", "http://c", "--otlp-protocol", "thrift"], {}, "--otlp-protocol"),
        (["--otlp-endpoint", "http://c", "--trace-rate", "1.5"], {}, "--trace-rate"),
        (["--trace-rate", "often"], {}, "--trace-rate must be a number from 0 to 1"),
        ([], {"BATCHING_TRACE_RATE": "-1"}, "--trace-rate must be a number from 0 to 1"),
        (
            ["--otlp-endpoint", "http://c"],
            {"OTEL_TRACES_SAMPLER": "sometimes"},
            "OTEL_TRACES_SAMPLER must be one of",
        ),
        (
            ["--otlp-endpoint", "http://c"],
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG must be a number from 0 to 1",
        ),
        ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "nowhere"}, "OTEL_EXPORTER_OTLP_ENDPOINT must be"),
        ([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_PROTOCOL must be"),
    ],
)
def test_a_bad_tracing_setting_exits_2_with_one_line(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        parse_settings(argv, environ)
    assert exit.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    if not any(key.startswith("BATCHING_") for key in environ):
        flags = dict(zip(argv[::2], argv[1::2], strict=True))
        with pytest.raises(TracingConfigError):
            tracing_config(
                flags.get("--otlp-endpoint"),
                flags.get("--otlp-protocol"),
                flags.get("--trace-rate"),
                environ,
            )


def test_with_tracing_off_opentelemetry_is_never_imported() -> None:
    """A server without --otlp-endpoint serves requests on every door's module without
    loading OpenTelemetry at all."""
    program = """
import asyncio, sys
import httpx
from batching import create_app
import batching.grpc.v2, batching.http.openai, batching.http.v2, server
from tests.support.asgi import app_with, serving
from tests.support.models import EchoModel

async def main():
    async with serving(app_with(EchoModel())) as client:
        assert (await client.post("/", content=b"hi")).status_code == 200
asyncio.run(main())
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
assert not loaded, loaded
"""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]


async def test_requests_to_several_models_with_keys_are_traced_and_batched_per_model() -> None:
    keys = ApiKeys(["secret-key"])
    auth = {"authorization": "Bearer secret-key"}
    models = [
        ModelConfig(
            name=name,
            source="tests.support.models:EchoModel",
            batching=BatchingConfig(max_batch_size=4, max_queue_delay=20.0, timeout=25.0),
        )
        for name in ("first", "second")
    ]
    with HttpReceiver() as receiver:
        app = create_app(models, api_keys=keys, tracing=http_tracing(receiver))
        sent = {name: [traceparent() for _ in range(4)] for name in ("first", "second")}
        async with serving(app) as client:
            answers = await asyncio.gather(
                *(
                    client.post(
                        f"/models/{name}",
                        content=f"{name} {i}".encode(),
                        headers={"traceparent": tp, **auth},
                    )
                    for name, parents in sent.items()
                    for i, (tp, _, _) in enumerate(parents)
                )
            )
            assert [answer.status_code for answer in answers] == [200] * 8
            tp, refused_trace, _ = traceparent()
            refused = await client.post("/models/second", content=b"x", headers={"traceparent": tp})
            assert refused.status_code == 401
        spans = {span.trace_id: span for span in server_spans(receiver, "POST")}
        for name, parents in sent.items():
            ids = set()
            for _, trace_id, parent_id in parents:
                span = spans[trace_id]
                assert span.parent_span_id == parent_id
                assert attributes_of(span)["batching.model"] == name
                ids.add((span.trace_id, span.span_id))
            (batch,) = receiver.named(f"batch {name}")
            assert {(link.trace_id, link.span_id) for link in batch.links} == ids
            assert attributes_of(batch)["batching.instance"] == f"{name}-0"
        assert attributes_of(spans[refused_trace])["http.response.status_code"] == 401
