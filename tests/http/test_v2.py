"""The KServe v2 protocol over a real socket, driven by NVIDIA's own tritonclient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.servers import running

pytestmark = pytest.mark.anyio

TEXTS = ["a", "hello", "ünïcødé text", "the quick brown fox"]


def expected_rows(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), ord(t[0]), 1.0, -1.0] for t in texts], dtype=np.float32)


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    models = [
        ModelConfig(
            name="vectors",
            source="tests.support.models:VectorModel",
            batching=BatchingConfig(max_batch_size=8),
        ),
        ModelConfig(name="echo", source="tests.support.models:EchoModel", version="3"),
    ]
    async with running(create_app(models)) as url:
        yield url


def text_input(texts: list[str], binary: bool) -> triton_http.InferInput:
    tensor = triton_http.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1), binary_data=binary)
    return tensor


def _sync_round_trip(url: str, binary: bool) -> None:
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("vectors")
        metadata = client.get_model_metadata("vectors")
        assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
        assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 4]}]
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        result = client.infer(
            "vectors",
            [text_input(TEXTS, binary)],
            outputs=[triton_http.InferRequestedOutput("embedding", binary_data=binary)],
            request_id="req-7",
        )
        np.testing.assert_array_equal(result.as_numpy("embedding"), expected_rows(TEXTS))
        assert result.get_response()["id"] == "req-7"
        assert result.get_response()["model_name"] == "vectors"
        # A request larger than max_batch_size (8) is split across batches and re-joined.
        many = [f"text number {i}" for i in range(21)]
        result = client.infer("vectors", [text_input(many, binary)])
        np.testing.assert_array_equal(result.as_numpy("embedding"), expected_rows(many))
        index = client.get_model_repository_index()
        assert {(m["name"], m["state"]) for m in index} == {
            ("vectors", "READY"),
            ("echo", "READY"),
        }
        with pytest.raises(InferenceServerException) as missing:
            client.infer("nope", [text_input(["x"], binary)])
        assert missing.value.status() == "404"
        with pytest.raises(InferenceServerException) as wrong_version:
            client.get_model_metadata("echo", model_version="1")
        assert wrong_version.value.status() == "404"
        assert client.get_model_metadata("echo", model_version="3")["versions"] == ["3"]
    finally:
        client.close()


@pytest.mark.parametrize("binary", [False, True])
async def test_tritonclient_sync(server_url: str, binary: bool) -> None:
    await asyncio.to_thread(_sync_round_trip, server_url, binary)


@pytest.mark.parametrize("binary", [False, True])
async def test_tritonclient_asyncio(server_url: str, binary: bool) -> None:
    client = triton_aio.InferenceServerClient(server_url.removeprefix("http://"))
    try:
        assert await client.is_model_ready("vectors")
        inputs = [text_input(TEXTS, binary)]
        outputs = [triton_aio.InferRequestedOutput("embedding", binary_data=binary)]
        results = await asyncio.gather(
            *(client.infer("vectors", inputs, outputs=outputs) for _ in range(16))
        )
        for result in results:
            np.testing.assert_array_equal(result.as_numpy("embedding"), expected_rows(TEXTS))
    finally:
        await client.close()


async def test_echo_outputs_come_back_as_json_strings(server_url: str) -> None:
    client = triton_aio.InferenceServerClient(server_url.removeprefix("http://"))
    try:
        result = await client.infer("echo", [text_input(["hi", "there"], True)])
        rows = result.as_numpy("echo")
    finally:
        await client.close()
    assert rows.shape == (2, 1)
    assert [row[0] for row in rows] == [
        b'{"input":"hi","length":2}',
        b'{"input":"there","length":5}',
    ]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"inputs": []}, 400, "must not be empty"),
        (
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}]},
            400,
            "'data' has 1 elements but the shape needs 2",
        ),
        (
            {"inputs": [{"name": "pixels", "datatype": "BYTES", "shape": [1], "data": ["a"]}]},
            400,
            "unexpected inference input",
        ),
        (
            {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
            422,
            "BYTES",
        ),
        (
            {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "outputs": [{"name": "logits"}],
            },
            400,
            "unexpected inference output",
        ),
        (
            {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "parameters": {"timeout": -5},
            },
            400,
            "timeout",
        ),
    ],
)
async def test_bad_v2_requests_get_triton_status_codes(
    server_url: str, body: dict[str, object], status: int, fragment: str
) -> None:
    async with httpx.AsyncClient(base_url=server_url) as client:
        response = await client.post("/v2/models/vectors/infer", json=body)
    assert response.status_code == status
    assert fragment in response.json()["error"]


async def test_model_config_and_ready_endpoints(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url) as client:
        config = (await client.get("/v2/models/vectors/config")).json()
        ready = await client.get("/v2/models/echo/versions/3/ready")
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert ready.status_code == 200


@pytest.mark.parametrize("binary", [False, True])
async def test_a_numeric_model_takes_typed_tensors(binary: bool) -> None:
    config = ModelConfig(
        name="sum",
        source="tests.support.models:SumModel",
        batching=BatchingConfig(max_batch_size=4),
    )
    async with running(create_app(config)) as url:
        client = triton_aio.InferenceServerClient(url.removeprefix("http://"))
        try:
            values = np.arange(30, dtype=np.float32).reshape(10, 3)
            tensor = triton_aio.InferInput("values", [10, 3], "FP32")
            tensor.set_data_from_numpy(values, binary_data=binary)
            outputs = [triton_aio.InferRequestedOutput("total", binary_data=binary)]
            result = await client.infer("sum", [tensor], outputs=outputs)
            ints = triton_aio.InferInput("values", [2, 3], "INT64")
            ints.set_data_from_numpy(np.ones((2, 3), dtype=np.int64), binary_data=binary)
            as_ints = await client.infer("sum", [ints])
        finally:
            await client.close()
    np.testing.assert_array_equal(result.as_numpy("total"), values.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(as_ints.as_numpy("total"), [[3.0], [3.0]])
