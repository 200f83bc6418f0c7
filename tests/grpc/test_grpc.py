"""KServe v2 over gRPC on a real socket, driven by NVIDIA's own tritonclient (sync and asyncio)
and by the stubs it ships, against the same server and queues as HTTP."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http.aio as triton_http_aio
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, InvalidRequest, ModelConfig, create_app
from batching.grpc.tensors import parse_infer_request
from batching.settings.cli import parse_settings
from tests.support.grpc_door import raw_output, serving_grpc, stub_for, typed_request
from tests.support.metrics import sample
from tests.support.models import EchoModel, GatedModel
from tests.support.servers import free_port, running

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def config(name: str, source: str, version: str = "1", **batching: Any) -> ModelConfig:
    return ModelConfig(
        name=name, source=source, version=version, batching=BatchingConfig(**batching)
    )


def echo(**batching: Any) -> ModelConfig:
    return config("echo", "tests.support.models:EchoModel", **batching)


def sums() -> ModelConfig:
    return config("sum", "tests.support.models:SumModel", version="2", max_batch_size=8)


def text_input(texts: list[str], module: Any = triton_grpc) -> Any:
    tensor = module.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return tensor


def values_input(values: np.ndarray, module: Any = triton_grpc) -> Any:
    tensor = module.InferInput("values", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return tensor


def echoed(rows: np.ndarray) -> list[str]:
    return [orjson.loads(row)["input"] for row in rows.reshape(-1)]


def status_of(error: InferenceServerException) -> str:
    return str(error.status()).removeprefix("StatusCode.")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def total(metrics: str, name: str, **labels: str) -> float:
    """The sum of every sample ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        found.value
        for family in text_string_to_metric_families(metrics)
        for found in family.samples
        if found.name == name and all(found.labels.get(k) == v for k, v in labels.items())
    )


async def wait_for_metric(
    client: httpx.AsyncClient, name: str, at_least: float, **labels: str
) -> str:
    """Poll ``/metrics`` until ``name`` (summed over other labels) reaches ``at_least``; fail
    if it never does."""
    for _ in range(1000):
        text = (await client.get("/metrics")).text
        if total(text, name, **labels) >= at_least:
            return text
        await asyncio.sleep(0.005)
    raise AssertionError(f"{name} {labels} never reached {at_least}")


# --- infer ---------------------------------------------------------------------------------


async def test_a_text_model_answers_raw_bytes_through_the_sync_client() -> None:
    async with serving_grpc(echo()) as (http, target):
        client = triton_grpc.InferenceServerClient(target)
        try:
            texts = ["hello", "wörld, ünïcødé", "the quick brown fox"]
            result = await asyncio.to_thread(
                client.infer, "echo", [text_input(texts)], request_id="call-1"
            )
        finally:
            client.close()
        rows = result.as_numpy("echo")
        assert rows.shape == (3, 1)
        assert [orjson.loads(row) for row in rows.reshape(-1)] == [
            {"input": text, "length": len(text)} for text in texts
        ]
        response = result.get_response()
        assert (response.model_name, response.model_version, response.id) == ("echo", "1", "call-1")
        # Counted with HTTP's requests, under the status HTTP would have answered.
        metrics = (await http.get("/metrics")).text
        assert sample(metrics, "batching_requests_total", model="echo", code="200") == 1


async def test_a_text_model_takes_typed_bytes_contents() -> None:
    async with serving_grpc(echo()) as (_, target), stub_for(target) as stub:
        request = typed_request("echo", "text", "BYTES", [2, 1], "bytes_contents", [b"a", b"bb"])
        response = await stub.ModelInfer(request)
    assert echoed(raw_output(response)) == ["a", "bb"]


async def test_messages_over_grpcs_4_mib_default_pass_both_ways_up_to_max_body_bytes() -> None:
    big = "x" * (6 << 20)
    async with serving_grpc(echo(), max_body_bytes=8 << 20) as (_, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            result = await client.infer("echo", [text_input([big], triton_grpc_aio)])
        finally:
            await client.close()
    assert orjson.loads(result.as_numpy("echo")[0, 0])["length"] == len(big)


async def test_a_numeric_model_takes_raw_and_typed_tensors() -> None:
    values = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]], dtype=np.float32)
    expected = values.sum(axis=1, keepdims=True)
    async with serving_grpc(sums()) as (_, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            result = await client.infer("sum", [values_input(values, triton_grpc_aio)])
        finally:
            await client.close()
        assert result.as_numpy("total").dtype == np.float32
        np.testing.assert_array_equal(result.as_numpy("total"), expected)
        async with stub_for(target) as stub:
            fp32 = typed_request("sum", "values", "FP32", [2, 3], "fp32_contents", values.ravel())
            int32 = typed_request("sum", "values", "INT32", [1, 3], "int_contents", [1, -2, 40])
            from_fp32 = await stub.ModelInfer(fp32)
            from_int32 = await stub.ModelInfer(int32)
    np.testing.assert_array_equal(raw_output(from_fp32), expected)
    assert from_fp32.model_version == "2"
    np.testing.assert_array_equal(raw_output(from_int32), [[39.0]])


async def test_the_same_text_gives_the_same_vector_over_grpc_and_http_v2() -> None:
    texts = ["a", "hello", "ünïcødé text", "the quick brown fox"]
    vectors = config("vectors", "tests.support.models:VectorModel", max_batch_size=8)
    async with serving_grpc(vectors) as (http, target):
        grpc_client = triton_grpc_aio.InferenceServerClient(target)
        http_client = triton_http_aio.InferenceServerClient(
            str(http.base_url).removeprefix("http://")
        )
        try:
            over_grpc = await grpc_client.infer("vectors", [text_input(texts, triton_grpc_aio)])
            http_input = triton_http_aio.InferInput("text", [len(texts), 1], "BYTES")
            http_input.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
            over_http = await http_client.infer(
                "vectors",
                [http_input],
                outputs=[triton_http_aio.InferRequestedOutput("embedding", binary_data=True)],
            )
        finally:
            await grpc_client.close()
            await http_client.close()
    from_grpc, from_http = over_grpc.as_numpy("embedding"), over_http.as_numpy("embedding")
    assert from_grpc.dtype == from_http.dtype == np.float32
    assert from_grpc.shape == (4, 4)
    assert from_grpc.tobytes() == from_http.tobytes()


async def test_64_calls_in_flight_are_batched_and_each_gets_its_own_rows() -> None:
    cost = config("cost", "tests.support.models:CostModel", max_batch_size=32, max_queue_delay=0.02)
    async with serving_grpc(cost) as (http, target):
        client = triton_grpc.InferenceServerClient(target)
        answers: dict[int, Any] = {}
        all_answered = threading.Event()

        def answer(index: int, result: Any, error: Any) -> None:
            answers[index] = error if error is not None else result
            if len(answers) == 64:
                all_answered.set()

        try:
            for index in range(64):
                client.async_infer(
                    "cost",
                    [text_input([f"call{index}"])],
                    lambda result, error, index=index: answer(index, result, error),
                )
            assert await asyncio.to_thread(all_answered.wait, 60), f"{len(answers)} of 64 answered"
        finally:
            client.close()
        for index, answered in answers.items():
            assert not isinstance(answered, Exception), answered
            assert echoed(answered.as_numpy("echo")) == [f"call{index}"]
        metrics = (await http.get("/metrics")).text
    family = "batching_batch_size_items"
    assert sample(metrics, f"{family}_sum", model="cost") == 64
    batches = sample(metrics, f"{family}_count", model="cost")
    singles = sample(metrics, f"{family}_bucket", model="cost", le="1.0")
    # Batches of more than one call formed: fewer batches than calls, not all of them singles.
    assert batches < 64
    assert singles < batches


def _request(*tensors: tuple[str, str, list[int]], raw: list[bytes] | None = None) -> Any:
    request = service_pb2.ModelInferRequest(model_name="m")
    for name, datatype, shape in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raw or [])
    return request


def test_raw_and_typed_tensors_decode_as_the_http_binary_extension_does() -> None:
    flags = parse_infer_request(_request(("b", "BOOL", [3]), raw=[b"\x01\x00\x01"]))
    assert flags.inputs[0].data.tolist() == [True, False, True]
    halves = np.array([[0.5, -2.0]], dtype="<f2")
    fp16 = parse_infer_request(_request(("h", "FP16", [1, 2]), raw=[halves.tobytes()]))
    assert fp16.inputs[0].data.dtype == np.float16
    np.testing.assert_array_equal(fp16.inputs[0].data, halves)
    texts = parse_infer_request(
        _request(("t", "BYTES", [2]), raw=[b"\x01\x00\x00\x00a\x00\x00\x00\x00"])
    )
    assert texts.inputs[0].data.tolist() == [b"a", b""]
    typed = typed_request("m", "i", "INT8", [2], "int_contents", [-128, 127])
    typed.id = "abc"
    typed.parameters["timeout"].int64_param = 5
    typed.parameters["flag"].bool_param = True
    parsed = parse_infer_request(typed)
    assert parsed.inputs[0].data.dtype == np.int8 and parsed.inputs[0].data.tolist() == [-128, 127]
    assert (parsed.id, parsed.parameters) == ("abc", {"timeout": 5, "flag": True})


@pytest.mark.parametrize(
    ("request_of", "fragment"),
    [
        (lambda: _request(), "no inputs"),
        (lambda: _request(("a", "FP32", [1]), ("b", "FP32", [1]), raw=[b"0000"]), "2 inputs"),
        (lambda: _request(("a", "FP32", [2]), raw=[b"0000"]), "take 8"),
        (lambda: _request(("a", "BF16", [1]), raw=[b"00"]), "BF16"),
        (lambda: _request(("a", "FP8", [1]), raw=[b"0"]), "unknown datatype"),
        (lambda: _request(("a", "FP32", [-1]), raw=[b""]), "negative"),
        (lambda: _request(("a", "BOOL", [1]), raw=[b"\x02"]), "0 or 1"),
        (lambda: _request(("a", "BYTES", [1]), raw=[b"\x01\x00"]), "truncated"),
        (lambda: _request(("a", "BYTES", [1]), raw=[b"\x00" * 8]), "more than the 1"),
        (
            lambda: _request(("a", "FP32", [1]), ("a", "FP32", [1]), raw=[b"0000"] * 2),
            "more than once",
        ),
        (lambda: _request(("a", "FP32", [2])), "no data"),
        (lambda: typed_request("m", "a", "FP16", [1], "fp32_contents", [1.0]), "send it raw"),
        (lambda: typed_request("m", "a", "INT8", [1], "int_contents", [128]), "[-128, 127]"),
        (lambda: typed_request("m", "a", "FP32", [2], "fp32_contents", [1.0]), "shape needs 2"),
    ],
)
def test_malformed_requests_are_invalid_requests(request_of: Any, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(fragment)):
        parse_infer_request(request_of())


def test_the_grpc_port_flag_tells_an_asked_for_port_from_the_default() -> None:
    default = parse_settings([], {})
    assert (default.grpc_port, default.grpc_port_explicit) == (8001, False)
    flag = parse_settings(["--grpc-port", "9001"], {})
    assert (flag.grpc_port, flag.grpc_port_explicit) == (9001, True)
    variable = parse_settings([], {"BATCHING_GRPC_PORT": "0"})
    assert (variable.grpc_port, variable.grpc_port_explicit) == (0, True)
    with pytest.raises(SystemExit):
        parse_settings(["--grpc-port", "70000"], {})


# --- health, metadata, configuration, statistics ------------------------------------------


async def test_health_metadata_configuration_and_statistics_match_http() -> None:
    async with serving_grpc([sums(), echo()]) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("sum")
            assert await client.is_model_ready("sum", "2")
            assert not await client.is_model_ready("sum", "7")
            assert not await client.is_model_ready("nope")

            server = await client.get_server_metadata()
            server_json = (await http.get("/v2")).json()
            assert server.name == server_json["name"] == "batching"
            assert server.version == server_json["version"]
            assert list(server.extensions) == server_json["extensions"]

            metadata = await client.get_model_metadata("sum")
            over_http = (await http.get("/v2/models/sum")).json()
            assert metadata.name == "sum" and list(metadata.versions) == ["2"]
            assert metadata.platform == over_http["platform"]
            assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
                ("values", "FP32", [-1, 3])
            ]
            assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
                (t["name"], t["datatype"], t["shape"]) for t in over_http["outputs"]
            ]

            model_config = (await client.get_model_config("sum")).config
            config_json = (await http.get("/v2/models/sum/config")).json()
            assert model_config.name == "sum"
            assert model_config.max_batch_size == 8 == config_json["max_batch_size"]
            assert [(t.name, t.data_type, list(t.dims)) for t in model_config.input] == [
                ("values", model_config_pb2.TYPE_FP32, [3])
            ]
            queue_delay = model_config.dynamic_batching.max_queue_delay_microseconds
            assert queue_delay == config_json["dynamic_batching"]["max_queue_delay_microseconds"]

            values = np.ones((2, 3), dtype=np.float32)
            for _ in range(3):
                await client.infer("sum", [values_input(values, triton_grpc_aio)])
            stats = (await client.get_inference_statistics("sum")).model_stats
            over_http = (await http.get("/v2/models/sum/stats")).json()["model_stats"]
            assert [(s.name, s.version) for s in stats] == [("sum", "2")]
            assert stats[0].inference_stats.success.count == 3
            assert (
                stats[0].inference_stats.success.count
                == (over_http[0]["inference_stats"]["success"]["count"])
            )
            assert stats[0].inference_count == over_http[0]["inference_count"]
            every = (await client.get_inference_statistics()).model_stats
            assert sorted(s.name for s in every) == ["echo", "sum"]

            index = (await client.get_model_repository_index()).models
            assert sorted((m.name, m.version, m.state) for m in index) == [
                ("echo", "1", "READY"),
                ("sum", "2", "READY"),
            ]
        finally:
            await client.close()


# --- errors ----------------------------------------------------------------------------------


async def expect_error(call: Any, code: str, *fragments: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        await call
    assert status_of(caught.value) == code, caught.value
    message = str(caught.value.message())
    for fragment in fragments:
        assert fragment in message, message
    return message


async def test_errors_map_to_grpc_status_codes_and_are_counted_as_on_http() -> None:
    async with serving_grpc([echo(max_items_per_request=4), sums()]) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            ok = text_input(["fine"], triton_grpc_aio)
            await expect_error(client.infer("nope", [ok]), "NOT_FOUND", "nope")
            await expect_error(client.infer("echo", [ok], model_version="9"), "NOT_FOUND")
            await expect_error(client.get_model_metadata("nope"), "NOT_FOUND")
            await expect_error(client.get_model_config("nope"), "NOT_FOUND")
            await expect_error(client.get_inference_statistics("nope"), "NOT_FOUND")

            wrong_name = triton_grpc_aio.InferInput("texts", [1, 1], "BYTES")
            wrong_name.set_data_from_numpy(np.array([["x"]], dtype=object))
            await expect_error(client.infer("echo", [wrong_name]), "INVALID_ARGUMENT", "texts")
            numbers = triton_grpc_aio.InferInput("text", [1, 3], "FP32")
            numbers.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
            # Well-formed, but not what a text model takes (HTTP's 422).
            await expect_error(client.infer("echo", [numbers]), "INVALID_ARGUMENT", "BYTES")
            too_many = text_input(["a"] * 5, triton_grpc_aio)
            # Over the item cap (HTTP's 413): the request's fault, so INVALID_ARGUMENT.
            await expect_error(client.infer("echo", [too_many]), "INVALID_ARGUMENT", "at most 4")
            await expect_error(client.infer("echo", [ok], timeout=0), "INVALID_ARGUMENT", "timeout")
            # A parameter the server does not apply is refused, never ignored; Triton's own
            # (which tritonclient and perf_analyzer send) are accepted.
            await expect_error(
                client.infer("echo", [ok], parameters={"custom": "x"}), "INVALID_ARGUMENT", "custom"
            )
            result = await client.infer(
                "echo", [ok], priority=1, sequence_id=7, sequence_start=True, timeout=5_000_000
            )
            assert echoed(result.as_numpy("echo")) == ["fine"]
        finally:
            await client.close()

        async with stub_for(target) as stub:
            truncated = typed_request("echo", "text", "BYTES", [1, 1], "bytes_contents", [])
            truncated.raw_input_contents.append(b"\x05\x00\x00\x00abc")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ModelInfer(truncated)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "claims 5 bytes" in str(caught.value.details())
            wrong_field = typed_request("sum", "values", "FP32", [1, 3], "fp64_contents", [1, 2, 3])
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ModelInfer(wrong_field)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "fp32_contents" in str(caught.value.details())
            # What perf_analyzer sends, which tritonclient itself would refuse to.
            tolerated = typed_request("echo", "text", "BYTES", [1, 1], "bytes_contents", [b"pa"])
            tolerated.parameters["triton_enable_empty_final_response"].bool_param = True
            assert echoed(raw_output(await stub.ModelInfer(tolerated))) == ["pa"]

        metrics = (await http.get("/metrics")).text
    counted = {
        code: sample(metrics, "batching_requests_total", 0.0, model="echo", code=code)
        for code in ("200", "400", "413", "422")
    }
    assert counted == {"200": 2, "400": 4, "413": 1, "422": 1}


async def test_a_model_that_raises_is_internal_without_its_details() -> None:
    class Broken(EchoModel):
        def predict(self, inputs: list[Any]) -> list[Any]:
            raise RuntimeError("secret internal detail")

    async with serving_grpc(echo(), model=Broken()) as (_, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            message = await expect_error(
                client.infer("echo", [text_input(["boom"], triton_grpc_aio)]), "INTERNAL"
            )
        finally:
            await client.close()
    assert "secret" not in message and "Traceback" not in message


async def test_overload_is_unavailable() -> None:
    model = GatedModel()
    async with serving_grpc(echo(max_queue_size=2), model=model) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            holder = asyncio.ensure_future(
                client.infer("echo", [text_input(["holds"], triton_grpc_aio)])
            )
            await asyncio.to_thread(model.entered.wait, 10)
            queued = asyncio.ensure_future(
                client.infer("echo", [text_input(["q1", "q2"], triton_grpc_aio)])
            )
            await wait_for_metric(http, "batching_queue_depth_items", 2, model="echo")
            await expect_error(
                client.infer("echo", [text_input(["one too many"], triton_grpc_aio)]),
                "UNAVAILABLE",
                "overloaded",
            )
            model.gate.set()
            assert echoed((await holder).as_numpy("echo")) == ["holds"]
            assert echoed((await queued).as_numpy("echo")) == ["q1", "q2"]
        finally:
            model.gate.set()
            await client.close()
        metrics = (await http.get("/metrics")).text
    assert sample(metrics, "batching_requests_total", model="echo", code="503") == 1


async def test_the_callers_deadline_drops_its_items_before_the_model_computes_them() -> None:
    model = GatedModel()
    async with serving_grpc(echo(), model=model) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            holder = asyncio.ensure_future(
                client.infer("echo", [text_input(["holds"], triton_grpc_aio)])
            )
            await asyncio.to_thread(model.entered.wait, 10)
            late = text_input(["late1", "late2"], triton_grpc_aio)
            await expect_error(
                client.infer("echo", [late], client_timeout=0.3), "DEADLINE_EXCEEDED"
            )
            # The `timeout` parameter (microseconds) lowers the deadline as on HTTP: here it is
            # the server that answers, within a longer gRPC deadline.
            await expect_error(
                client.infer(
                    "echo",
                    [text_input(["short"], triton_grpc_aio)],
                    timeout=300_000,
                    client_timeout=20,
                ),
                "DEADLINE_EXCEEDED",
                "deadline",
            )
            model.gate.set()
            assert echoed((await holder).as_numpy("echo")) == ["holds"]
            after = await client.infer("echo", [text_input(["after"], triton_grpc_aio)])
            assert echoed(after.as_numpy("echo")) == ["after"]
        finally:
            model.gate.set()
            await client.close()
        await wait_for_metric(http, "batching_dropped_items_total", 3, model="echo")
        # The call whose client gave up is counted when the server's handler ends, which on a
        # busy machine can come after its items were dropped.
        metrics = await wait_for_metric(
            http, "batching_requests_total", 2, model="echo", code="504"
        )
    computed = [item for batch in model.batches for item in batch]
    assert "holds" in computed and "after" in computed
    assert not {"late1", "late2", "short"} & set(computed)
    assert sample(metrics, "batching_requests_total", model="echo", code="504") == 2
    assert sample(metrics, "batching_dropped_items_total", model="echo") == 3


async def test_a_cancelled_call_is_dropped_before_it_is_batched() -> None:
    model = GatedModel()
    async with serving_grpc(echo(), model=model) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            holder = asyncio.ensure_future(
                client.infer("echo", [text_input(["holds"], triton_grpc_aio)])
            )
            await asyncio.to_thread(model.entered.wait, 10)
            gone = asyncio.ensure_future(
                client.infer("echo", [text_input(["gone"], triton_grpc_aio)])
            )
            await wait_for_metric(http, "batching_queue_depth_items", 1, model="echo")
            gone.cancel()
            await wait_for_metric(http, "batching_requests_total", 1, model="echo", code="499")
            model.gate.set()
            assert echoed((await holder).as_numpy("echo")) == ["holds"]
        finally:
            model.gate.set()
            await client.close()
        await wait_for_metric(
            http, "batching_dropped_items_total", 1, model="echo", reason="cancelled"
        )
    assert "gone" not in [item for batch in model.batches for item in batch]


# --- the port --------------------------------------------------------------------------------


async def test_a_taken_default_port_logs_one_line_and_serves_http(
    taken_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(echo(), grpc_port=taken_port, grpc_port_explicit=False)
    with caplog.at_level(logging.INFO, logger="batching"):
        async with running(app) as url, httpx.AsyncClient(base_url=url) as client:
            response = await client.post(
                "/v2/models/echo/infer",
                json={
                    "inputs": [
                        {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}
                    ]
                },
            )
            assert response.status_code == 200
    assert app.state.grpc is not None and not app.state.grpc.serving
    lines = [record.getMessage() for record in caplog.records if "gRPC" in record.getMessage()]
    assert len(lines) == 1, lines
    assert f":{taken_port}" in lines[0] and "HTTP only" in lines[0]


async def test_a_second_server_on_the_same_default_port_serves_http_only() -> None:
    port = free_port()
    first = create_app(echo(), grpc_port=port, grpc_port_explicit=False)
    second = create_app(echo(), grpc_port=port, grpc_port_explicit=False)
    async with running(first), running(second):
        # gRPC would have let both bind with SO_REUSEPORT and split the calls between them.
        assert first.state.grpc.serving and not second.state.grpc.serving


async def test_a_taken_explicit_port_is_reported_to_whoever_created_the_app(
    taken_port: int,
) -> None:
    reasons: list[str] = []
    app = create_app(echo(), grpc_port=taken_port, on_grpc_failure=reasons.append)
    async with running(app, wait_ready=False):
        pass
    assert len(reasons) == 1
    assert f"127.0.0.1:{taken_port}" in reasons[0] and "--grpc-port" in reasons[0]


async def test_port_zero_turns_grpc_off() -> None:
    app = create_app(echo(), grpc_port=0)
    async with running(app):
        assert app.state.grpc is None


@pytest.mark.slow
async def test_server_py_stops_with_one_line_when_an_explicit_port_is_taken(
    taken_port: int,
) -> None:
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "server.py", "--model", "tests.support.models:EchoModel"],
        *["--port", str(free_port()), "--grpc-port", str(taken_port)],
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines = stderr.decode().splitlines()
    assert process.returncode == 1
    # One line says what is wrong and what to do; nothing else is an error.
    assert [line for line in lines if line.startswith("server.py:") or " ERROR " in line] == [
        f"server.py: error: cannot serve gRPC on 127.0.0.1:{taken_port}: Address already in use "
        "(--grpc-port picks another port, 0 turns gRPC off)"
    ], stderr.decode()
    assert "Traceback" not in stdout.decode() + stderr.decode()


@pytest.mark.slow
async def test_sigterm_finishes_every_accepted_grpc_call_and_exits_in_bounded_time() -> None:
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "COST_MODEL_A_MS": "40", "COST_MODEL_B_MS": "1"}
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "server.py", "--model", "tests.support.models:CostModel"],
        *["--port", str(port), "--grpc-port", str(grpc_port), "--max-batch-size", "8"],
        *["--shutdown-timeout-s", "20"],
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for _ in range(500):
                try:
                    if (await http.get("/v2/health/ready")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("server never became ready")
            client = triton_grpc_aio.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            try:
                # 40 one-item calls at 8 per ~50 ms batch: about 250 ms of accepted work.
                calls = [
                    asyncio.ensure_future(
                        client.infer("CostModel", [text_input([f"job{i}"], triton_grpc_aio)])
                    )
                    for i in range(40)
                ]
                for _ in range(500):
                    metrics = (await http.get("/metrics")).text
                    ran = sample(metrics, "batching_batch_size_items_count", 0.0, model="CostModel")
                    depth = sample(metrics, "batching_queue_depth_items", model="CostModel")
                    if ran and depth >= 16:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the queue never held 16 items behind a running batch")
                signalled = time.monotonic()
                process.send_signal(signal.SIGTERM)
                answers = await asyncio.gather(*calls, return_exceptions=True)
            finally:
                await client.close()
        served = 0
        for index, answer in enumerate(answers):
            if isinstance(answer, InferenceServerException):
                # Told to retry elsewhere, never lost or left hanging.
                assert status_of(answer) == "UNAVAILABLE", (answer.message(), answers)
            else:
                assert echoed(answer.as_numpy("echo")) == [f"job{index}"]
                served += 1
        assert served >= 16
        returncode = await asyncio.wait_for(process.wait(), 25)
        assert time.monotonic() - signalled < 25
        assert returncode in (0, -signal.SIGTERM)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        assert process.stdout is not None
        output = (await process.stdout.read()).decode()
    assert "Traceback" not in output, output
