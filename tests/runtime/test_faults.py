"""Faults: clients that hang up, instances that die, a poisoned input among good ones."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.metrics import sample
from tests.support.models import EchoModel, GatedModel, MortalModel
from tests.support.servers import running

pytestmark = pytest.mark.anyio


async def test_jobs_of_clients_that_hang_up_never_reach_the_model() -> None:
    model = GatedModel()
    app = create_app(ModelConfig(name="gated"), builder=lambda _: model)
    async with running(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as patient:
            holder = asyncio.ensure_future(patient.post("/", content=b"holder"))
            await asyncio.to_thread(model.entered.wait, 10)
            kept = [
                asyncio.ensure_future(patient.post("/", content=f"kept{i}".encode()))
                for i in range(10)
            ]

            async def hang_up(index: int) -> None:
                async with httpx.AsyncClient(base_url=url, timeout=0.3) as impatient:
                    with pytest.raises(httpx.TimeoutException):
                        await impatient.post("/", content=f"gone{index}".encode())

            await asyncio.gather(*(hang_up(i) for i in range(10)))
            # The server has seen every hang-up once it has answered them 499 (to nobody).
            for _ in range(1000):
                metrics = (await patient.get("/metrics")).text
                if sample(metrics, "batching_requests_total", 0.0, code="499", model="gated") == 10:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the server never noticed the hang-ups")
            model.gate.set()
            assert (await holder).status_code == 200
            for future in kept:
                assert (await future).status_code == 200
            metrics = (await patient.get("/metrics")).text
    computed = [item for batch in model.batches for item in batch]
    assert sorted(computed) == sorted(["holder", *(f"kept{i}" for i in range(10))])
    assert len(computed) < 21  # 21 submitted, the 10 abandoned ones never computed
    assert sample(metrics, "batching_dropped_items_total", model="gated", reason="cancelled") == 10


async def test_a_dead_instance_fails_its_batch_fast_restarts_and_serves_again() -> None:
    MortalModel.loads = 0
    app = create_app(ModelConfig(name="mortal"), builder=lambda _: MortalModel())
    async with running(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            died = await client.post("/", content=b"die")
            assert died.status_code == 503
            assert "retry" in died.json()["error"]
            for _ in range(1000):
                if (await client.get("/v2/health/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the restarted instance never became ready")
            after = await client.post("/", content=b"alive")
    assert after.status_code == 200
    assert MortalModel.loads == 2


async def test_a_poisoned_request_fails_alone_while_its_batch_mates_succeed() -> None:
    class Picky(GatedModel):
        def predict(self, inputs: list[Any]) -> list[Any]:
            result = super().predict(inputs)
            if "poison" in inputs:
                raise ValueError("cannot digest poison")
            return list(result)

    model = Picky()
    config = ModelConfig(name="picky", batching=BatchingConfig(max_batch_size=64))
    app = create_app(config, builder=lambda _: model)
    async with running(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            holder = asyncio.ensure_future(client.post("/", content=b"holder"))
            await asyncio.to_thread(model.entered.wait, 10)
            texts = [f"good{i}" for i in range(6)] + ["poison"] + [f"fine{i}" for i in range(6)]
            futures = [asyncio.ensure_future(client.post("/", content=t.encode())) for t in texts]
            for _ in range(1000):
                metrics = (await client.get("/metrics")).text
                if sample(metrics, "batching_queue_depth_items", 0.0, model="picky") == len(texts):
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError(f"the {len(texts)} requests were never all queued")
            model.gate.set()
            answers = {text: await future for text, future in zip(texts, futures, strict=True)}
            await holder
    for text, response in answers.items():
        if text == "poison":
            assert response.status_code == 500
            assert "digest" not in response.text
        else:
            assert response.status_code == 200, text
            assert response.json()["outputs"][0]["input"] == text
    assert max(len(batch) for batch in model.batches) == len(texts)


async def test_a_model_with_the_wrong_output_count_fails_that_batch_with_500() -> None:
    class Lossy(EchoModel):
        def predict(self, inputs: list[Any]) -> list[Any]:
            return list(super().predict(inputs))[:-1]

    app = create_app(ModelConfig(name="lossy"), builder=lambda _: Lossy())
    async with running(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/", json={"inputs": ["a", "b"]})
    assert response.status_code == 500
    # A 500 names the request id, under which the log has the details.
    request_id = response.headers["x-request-id"]
    assert response.json() == {
        "error": f"the model returned the wrong number of outputs (request id {request_id})"
    }
