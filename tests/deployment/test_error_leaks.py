"""Errors that never leak: a tokenizer or a model that raises with a path and an address in its
text is answered on every door (plain, KServe v2 over HTTP and gRPC, OpenAI embeddings, rerank)
without them, with the request id, and the log has the details under that id; an unexpected
500 keeps its keep-alive connection usable and carries the request id."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.grpc_door import serving_grpc, stub_for, typed_request
from tests.support.models import EchoModel, VectorModel
from tests.support.servers import running

pytestmark = pytest.mark.anyio

#: What a tokenizer or model may say of itself: a path and a memory address.
SECRET = "cannot open /opt/models/secret/tokenizer.json for <Tokenizer object at 0x7f3a2b1c9d00>"
LEAKS = ("/opt/models", "0x7f3a", "Tokenizer object", "Traceback", "RuntimeError(")


def _raise_on(item: Any, word: str) -> None:
    texts = item.values() if isinstance(item, dict) else [item]
    if any(isinstance(text, str) and text.startswith(word) for text in texts):
        raise RuntimeError(SECRET)


class LeakyEmbedder(VectorModel):
    """Embeds like :class:`VectorModel`; its tokenizer raises on texts starting "untokenizable",
    its forward on "boom", each with :data:`SECRET`."""

    def count_tokens(self, item: Any) -> int:
        _raise_on(item, "untokenizable")
        return len(str(item))

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        for item in inputs:
            _raise_on(item, "boom")
        return super().predict(inputs)


class LeakyPairs(LeakyEmbedder):
    """The same, taking text pairs (a rerank model)."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        for item in inputs:
            _raise_on(item, "boom")
        return [np.array([0.5], dtype=np.float32) for _ in inputs]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [-1]},
                {"name": "text_pair", "datatype": "BYTES", "shape": [-1]},
            ],
            "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 1]}],
        }


MODELS = {"leaky": LeakyEmbedder(), "pairs": LeakyPairs()}


def _app_kwargs() -> dict[str, Any]:
    return {"builder": lambda config: MODELS[config.name]}


def _configs() -> list[ModelConfig]:
    # Batched by tokens, so that every door tokenizes (the /v1 doors always do, for usage).
    by_tokens = BatchingConfig(max_batch_tokens=4096)
    return [
        ModelConfig(name="leaky", batching=by_tokens),
        ModelConfig(name="pairs", batching=by_tokens),
    ]


def assert_clean(message: str) -> None:
    for leak in LEAKS:
        assert leak not in message, message


def assert_logged(caplog: pytest.LogCaptureFixture, request_id: str) -> None:
    lines = [record.getMessage() for record in caplog.records]
    assert any(request_id in line and SECRET in line for line in lines) or any(
        request_id in record.getMessage()
        and record.exc_info is not None
        and SECRET in str(record.exc_info[1])
        for record in caplog.records
    ), lines


async def test_tokenizer_and_model_failures_leak_nothing_on_any_http_door(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="batching")
    async with serving_grpc(_configs(), **_app_kwargs()) as (http, _):
        sdk = openai.AsyncOpenAI(
            base_url=f"{str(http.base_url).rstrip('/')}/v1", api_key="none", max_retries=0
        )
        for word, status in (("untokenizable", 422), ("boom", 500)):
            answers = [
                await http.post("/models/leaky", content=f"{word} text".encode()),
                await http.post(
                    "/v2/models/leaky/infer",
                    json={
                        "inputs": [
                            {
                                "name": "text",
                                "shape": [1],
                                "datatype": "BYTES",
                                "data": [f"{word} text"],
                            }
                        ]
                    },
                ),
                await http.post(
                    "/v1/rerank", json={"model": "pairs", "query": "q", "documents": [word]}
                ),
            ]
            for answer in answers:
                assert answer.status_code == status, (answer.request.url, answer.text)
                request_id = answer.headers["x-request-id"]
                assert_clean(answer.text)
                assert request_id in answer.text, answer.text
                assert_logged(caplog, request_id)
            with pytest.raises(openai.APIStatusError) as caught:
                await sdk.embeddings.create(model="leaky", input=[f"{word} text"])
            assert caught.value.status_code == status
            request_id = caught.value.response.headers["x-request-id"]
            assert_clean(caught.value.response.text)
            assert request_id in caught.value.message
            assert_logged(caplog, request_id)
        await sdk.close()


async def test_tokenizer_and_model_failures_leak_nothing_over_grpc(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="batching")
    async with serving_grpc(_configs(), **_app_kwargs()) as (_, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            for word, code in (("untokenizable", "INVALID_ARGUMENT"), ("boom", "INTERNAL")):
                tensor = triton_grpc_aio.InferInput("text", [1], "BYTES")
                tensor.set_data_from_numpy(np.array([f"{word} text"], dtype=object))
                with pytest.raises(InferenceServerException) as caught:
                    await client.infer("leaky", [tensor], request_id=f"call-{word}")
                assert str(caught.value.status()) == f"StatusCode.{code}"
                message = str(caught.value.message())
                assert_clean(message)
                assert f"call-{word}" in message
                assert_logged(caplog, f"call-{word}")
        finally:
            await client.close()
        # The request id also comes back in the trailing metadata, as HTTP's header.
        async with stub_for(target) as stub:
            request = typed_request("leaky", "text", "BYTES", [1], "bytes_contents", [b"boom"])
            call = stub.ModelInfer(request, metadata=(("x-request-id", "traced-1"),))
            with pytest.raises(grpc.aio.AioRpcError) as caught_call:
                await call
            assert caught_call.value.code() == grpc.StatusCode.INTERNAL
            assert ("x-request-id", "traced-1") in tuple(caught_call.value.trailing_metadata())
            ok = typed_request("leaky", "text", "BYTES", [1], "bytes_contents", [b"fine"])
            done = stub.ModelInfer(ok)
            assert isinstance(await done, service_pb2.ModelInferResponse)
            assert any(key == "x-request-id" for key, _ in await done.trailing_metadata())


class Unencodable(EchoModel):
    """Answers with an object no door can encode: an error of the server's own, not a
    BatchingError, which only the last line of defence answers."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        return [object() for _ in inputs]


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[int, dict[str, str], bytes]:
    writer.write(
        b"POST / HTTP/1.1\r\nhost: test\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nhi"
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def test_an_unexpected_500_keeps_the_connection_and_carries_the_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="batching")
    app = create_app(ModelConfig(name="odd"), builder=lambda _: Unencodable())
    async with running(app) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            ids = set()
            for _ in range(20):  # one connection, twenty requests in a row
                status, headers, body = await asyncio.wait_for(_exchange(reader, writer), 10)
                assert status == 500
                assert headers.get("connection") != "close"
                request_id = headers["x-request-id"]
                assert request_id in body.decode()
                assert "object at 0x" not in body.decode()
                ids.add(request_id)
            assert len(ids) == 20
        finally:
            writer.close()
    # Each one's traceback is in the log, under its request id.
    logged = {
        found.group(1)
        for record in caplog.records
        if record.exc_info is not None
        and (found := re.search(r"request (\S+) failed", record.getMessage())) is not None
    }
    assert logged >= ids


class UnloadableModel(EchoModel):
    def load(self, device: str) -> None:
        raise OSError(SECRET)


async def test_a_model_that_cannot_load_says_so_without_its_paths(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="batching")
    failed = asyncio.Event()
    app = create_app(
        ModelConfig(name="gone"),
        builder=lambda _: UnloadableModel(),
        on_load_failure=lambda *_: failed.set(),
    )
    async with running(app, wait_ready=False) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            await asyncio.wait_for(failed.wait(), 60)  # the load fails in the background
            index = (await client.post("/v2/repository/index")).json()
    assert index[0]["state"] == "UNAVAILABLE"
    assert "OSError" in index[0]["reason"]
    assert_clean(index[0]["reason"])
    assert any(SECRET in record.getMessage() for record in caplog.records)
