"""A fill-mask model and a text without its mask token: a 422 that names the token, through
every door (plain HTTP, KServe v2 over HTTP and over gRPC), decided before the text is queued,
so it never fails a batch. On a tiny offline BERT and real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2

from batching import ModelConfig
from tests.support.grpc_door import serving_grpc, stub_for
from tests.support.metrics import sample
from tests.support.tiny import masked_folder

pytestmark = pytest.mark.anyio

EXPECTED = "has no [MASK] token: this fill-mask model predicts the word at [MASK]"


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    config = ModelConfig(name="mlm", source=str(masked_folder(tmp_path)), task="fill-mask")
    async with serving_grpc(config) as served:
        yield served


def v2_body(texts: list[str]) -> dict[str, object]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}


async def test_a_text_without_the_mask_token_is_a_422_through_every_door(
    door: tuple[httpx.AsyncClient, str],
) -> None:
    http, target = door
    plain = await http.post("/models/mlm", content=b"the cat sat on the mat")
    listed = await http.post("/models/mlm", json={"inputs": ["the [MASK] sat", "the cat sat"]})
    v2 = await http.post("/v2/models/mlm/infer", json=v2_body(["a dog runs"]))
    async with stub_for(target) as stub:
        request = service_pb2.ModelInferRequest(model_name="mlm")
        tensor = request.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
        tensor.contents.bytes_contents.append(b"the red house")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ModelInfer(request)
    assert (plain.status_code, listed.status_code, v2.status_code) == (422, 422, 422)
    assert plain.json()["error"].startswith(f"inputs[0] {EXPECTED}")
    assert listed.json()["error"].startswith(f"inputs[1] {EXPECTED}")
    assert EXPECTED in v2.json()["error"]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert EXPECTED in (refused.value.details() or "")
    metrics = (await http.get("/metrics")).text
    # Refused before the queue: counted as 422s, and no batch ran for them.
    assert sample(metrics, "batching_requests_total", model="mlm", code="422") == 4
    assert sample(metrics, "batching_requests_total", 0.0, model="mlm", code="500") == 0
    ran = sample(metrics, "batching_batch_size_items_count", 0.0, model="mlm")
    good = await http.post("/models/mlm", json={"inputs": ["the [MASK] sat"]})
    assert good.status_code == 200
    metrics = (await http.get("/metrics")).text
    assert sample(metrics, "batching_batch_size_items_count", model="mlm") == ran + 1


async def test_a_text_without_the_token_never_fails_the_batch_it_would_have_joined(
    door: tuple[httpx.AsyncClient, str],
) -> None:
    http, _ = door
    texts = [f"the [MASK] sat on the mat {i}" for i in range(8)]
    answers = await asyncio.gather(
        *(http.post("/models/mlm", json={"inputs": [text]}) for text in texts),
        http.post("/models/mlm", json={"inputs": ["no mask at all"]}),
    )
    assert [answer.status_code for answer in answers] == [200] * 8 + [422]
    for answer in answers[:8]:
        (candidates,) = answer.json()["outputs"]
        assert candidates and {"token_str", "score", "sequence"} <= set(candidates[0])


async def test_a_mask_token_cut_off_by_truncation_is_a_422_that_says_so(
    door: tuple[httpx.AsyncClient, str],
) -> None:
    http, _ = door
    # The tiny model takes 64 tokens: the mask after 100 words is truncated away.
    late = " ".join(["cat"] * 100) + " [MASK]"
    answers = await asyncio.gather(
        http.post("/models/mlm", json={"inputs": [late]}),
        *(http.post("/models/mlm", json={"inputs": [f"the [MASK] sat {i}"]}) for i in range(4)),
    )
    assert [answer.status_code for answer in answers] == [422] + [200] * 4
    assert "beyond this model's 64-token limit" in answers[0].json()["error"]
    metrics = (await http.get("/metrics")).text
    assert sample(metrics, "batching_requests_total", 0.0, model="mlm", code="500") == 0
