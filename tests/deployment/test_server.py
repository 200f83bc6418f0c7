"""The app behind a real uvicorn on 127.0.0.1: real HTTP, real concurrency."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.metrics import sample
from tests.support.servers import running

pytestmark = pytest.mark.anyio


async def test_64_concurrent_clients_are_batched_and_each_gets_its_own_rows() -> None:
    config = ModelConfig(
        name="cost",
        source="tests.support.models:CostModel",
        batching=BatchingConfig(max_batch_size=32, max_queue_delay=0.002),
    )
    async with running(create_app(config)) as url:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

            async def one_client(index: int) -> None:
                for round_ in range(5):
                    items = [f"client{index}-round{round_}-item{k}" for k in range(1 + index % 3)]
                    response = await client.post("/", json={"inputs": items})
                    assert response.status_code == 200, response.text
                    assert [row["input"] for row in response.json()["outputs"]] == items

            await asyncio.gather(*(one_client(index) for index in range(64)))
            metrics = (await client.get("/metrics")).text
    family = "batching_batch_size_items_bucket"
    batches = sample(metrics, family, model="cost", le="+Inf")
    singles = sample(metrics, family, model="cost", le="1.0")
    items = sum(1 + index % 3 for index in range(64)) * 5
    assert sample(metrics, "batching_batch_size_items_sum", model="cost") == items
    # Batches larger than one item formed: fewer batches than requests, most not singles.
    assert batches < 64 * 5 / 2
    assert singles < batches / 2


async def test_413_over_a_real_socket_and_the_connection_survives() -> None:
    config = ModelConfig(name="echo", source="tests.support.models:EchoModel")
    async with running(create_app(config, max_body_bytes=1000)) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            big = await client.post("/", content=b"x" * 5000)
            assert big.status_code == 413
            assert "limit" in big.json()["error"]
            small = await client.post("/", content=b"fine")
            assert small.status_code == 200
