"""The metrics agree with the responses: every status a client receives is counted in
``batching_requests_total{code}``, and every answer without a result in
``batching_rejected_total{reason}`` under the reason the README's table gives for its status
code (413 too_large, 503 overloaded / would_miss_deadline / not_ready, 504 deadline). The 504's
body says which deadline passed, and where the request was."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.asgi import serving
from tests.support.models import EchoModel, GatedModel, SlowLoadModel

pytestmark = pytest.mark.anyio

#: The README's table: the rejection reason each refusal is counted under.
REASON_OF = {
    (413, "body"): "too_large",
    (413, "items"): "too_large",
    (503, "overloaded"): "overloaded",
    (503, "not ready"): "not_ready",
    (504, "deadline"): "deadline",
}


def counted(metrics: str, family: str, label: str) -> Counter[tuple[str, str]]:
    """``{(model, label value): count}`` of a counter family, as prometheus_client parses it."""
    found: Counter[tuple[str, str]] = Counter()
    for parsed in text_string_to_metric_families(metrics):
        for sample in parsed.samples:
            if sample.name == f"{family}_total" and sample.value:
                found[(sample.labels["model"], sample.labels[label])] += int(sample.value)
    return found


async def wait_for_queue(client: httpx.AsyncClient, model: str, items: int) -> None:
    for _ in range(2000):
        for family in text_string_to_metric_families((await client.get("/metrics")).text):
            for sample in family.samples:
                if (
                    sample.name == "batching_queue_depth_items"
                    and sample.labels["model"] == model
                    and sample.value >= items
                ):
                    return
        await asyncio.sleep(0.005)  # polling a gauge, as a scraper does
    raise AssertionError(f"{model}'s queue never held {items} items")


async def test_the_counters_match_every_status_the_clients_received() -> None:
    gated, short, loading = GatedModel(), GatedModel(), SlowLoadModel()
    models: dict[str, Any] = {
        "gated": gated,
        "short": short,
        "loading": loading,
        "echo": EchoModel(),
    }
    configs = [
        ModelConfig(
            name="gated", batching=BatchingConfig(max_queue_size=2, max_items_per_request=2)
        ),
        ModelConfig(name="short", batching=BatchingConfig(timeout=0.1)),
        ModelConfig(name="echo"),
        ModelConfig(name="loading"),
    ]
    app = create_app(configs, builder=lambda config: models[config.name], max_body_bytes=300)
    received: list[tuple[str, int, str]] = []

    def got(model: str, response: httpx.Response, kind: str = "") -> httpx.Response:
        received.append((model, response.status_code, kind))
        return response

    async with serving(app, wait_ready=False) as client:
        for name in ("gated", "short", "echo"):
            for _ in range(2000):
                if (await client.get(f"/v2/models/{name}/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.005)  # polling a probe, as an orchestrator does
        try:
            got("echo", await client.post("/models/echo", content=b"fine"))
            # 413: a body over the limit, through each door that reads one, and too many items.
            big = b"x" * 301
            got("echo", await client.post("/models/echo", content=big), "body")
            got("echo", await client.post("/v2/models/echo/infer", content=big), "body")
            # The /v1 body names its model, so it is refused before any model is known.
            got("", await client.post("/v1/embeddings", content=big), "body")
            three = {"inputs": ["a", "b", "c"]}
            got("gated", await client.post("/models/gated", json=three), "items")
            # 503 before the model is loaded.
            got("loading", await client.post("/models/loading", content=b"a"), "not ready")

            # 504 while running: the request's own deadline passes inside the model.
            running = await client.post(
                "/models/gated", content=b"runs", headers={"x-request-timeout-ms": "150"}
            )
            assert gated.entered.is_set()
            got("gated", running, "deadline")
            # 504 while queued, behind the batch that still holds the instance.
            queued = await client.post(
                "/models/gated", content=b"waits", headers={"x-request-timeout-ms": "50"}
            )
            got("gated", queued, "deadline")
            # The server's own deadline (--timeout-ms, here 100 ms), running and then queued.
            server_running = got(
                "short", await client.post("/models/short", content=b"s1"), "deadline"
            )
            server_queued = got(
                "short", await client.post("/models/short", content=b"s2"), "deadline"
            )
            # 503 overloaded: the queue holds 2 items (the expired one is still in it).
            later = asyncio.ensure_future(client.post("/models/gated", content=b"later"))
            await wait_for_queue(client, "gated", 2)
            got("gated", await client.post("/models/gated", content=b"over"), "overloaded")
        finally:
            gated.gate.set()
            short.gate.set()
            loading.loaded.set()
        got("gated", await later)
        metrics = (await client.get("/metrics")).text

    assert [status for _, status, _ in received] == [
        200, 413, 413, 413, 413, 503, 504, 504, 504, 504, 503, 200,
    ]  # fmt: skip
    assert running.json()["error"] == (
        "the deadline the request asked for (150 ms) passed while it was running"
    )
    assert queued.json()["error"] == (
        "the deadline the request asked for (50 ms) passed while it was queued"
    )
    assert server_running.json()["error"] == (
        "the server's deadline for model 'short' (100 ms, --timeout-ms) passed while it was running"
    )
    assert server_queued.json()["error"] == (
        "the server's deadline for model 'short' (100 ms, --timeout-ms) passed while it was queued"
    )
    by_code = Counter((model, str(status)) for model, status, _ in received)
    assert counted(metrics, "batching_requests", "code") == by_code
    by_reason = Counter(
        (model, REASON_OF[(status, kind)]) for model, status, kind in received if status != 200
    )
    assert counted(metrics, "batching_rejected", "reason") == by_reason
