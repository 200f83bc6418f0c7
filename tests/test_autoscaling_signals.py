"""The autoscaling gauges are true at the instant of the scrape, and the probes and /metrics
answer from the event loop within milliseconds while every instance is busy."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from batching import BatchingConfig, ModelConfig
from batching.metrics import autoscaling_signals
from tests.support.asgi import app_with, echo_config, serving
from tests.support.metrics import sample
from tests.support.models import GatedModel
from tests.support.servers import running

pytestmark = pytest.mark.anyio

SIGNALS = (
    "batching_queue_depth_items",
    "batching_queue_depth_requests",
    "batching_inflight_items",
    "batching_capacity_items_per_second",
    "batching_expected_wait_seconds",
    "batching_instances_busy_ratio",
)


def signals_of(metrics: str, model: str = "echo") -> dict[str, float]:
    return {name: sample(metrics, name, model=model) for name in SIGNALS}


async def wait_for_queue(client: httpx.AsyncClient, items: int) -> dict[str, float]:
    for _ in range(2000):
        found = signals_of((await client.get("/metrics")).text)
        if found["batching_queue_depth_items"] == items:
            return found
        await asyncio.sleep(0.002)  # polling /metrics, as a scraper does
    raise AssertionError(f"the queue never held {items} items: {found}")


def test_the_derived_signals() -> None:
    signals = autoscaling_signals(
        queued_items=30, running_items=10, busy_instances=1, ready_instances=2, per_instance=50.0
    )
    assert signals.capacity == 100.0
    assert signals.expected_wait == pytest.approx(0.4)
    assert signals.busy_ratio == 0.5
    # No instance ready: no capacity, but a finite wait priced at one instance, nothing busy.
    idle = autoscaling_signals(
        queued_items=5, running_items=0, busy_instances=0, ready_instances=0, per_instance=50.0
    )
    assert (idle.capacity, idle.expected_wait, idle.busy_ratio) == (0.0, 0.1, 0.0)


async def test_while_a_batch_is_held_the_gauges_read_the_true_queue() -> None:
    model = GatedModel()
    async with serving(app_with(model, echo_config(max_batch_size=4))) as client:
        idle = signals_of((await client.get("/metrics")).text)
        assert idle["batching_queue_depth_items"] == 0
        assert idle["batching_inflight_items"] == 0
        assert idle["batching_instances_busy_ratio"] == 0
        assert idle["batching_expected_wait_seconds"] == 0

        holder = asyncio.ensure_future(client.post("/", json={"inputs": ["h1", "h2"]}))
        await asyncio.to_thread(model.entered.wait, 10)
        queued = [
            asyncio.ensure_future(client.post("/", json={"inputs": inputs}))
            for inputs in (["a"], ["b", "c"], ["d", "e", "f"])
        ]
        held = await wait_for_queue(client, 6)
        assert held["batching_queue_depth_requests"] == 3
        assert held["batching_inflight_items"] == 2
        assert held["batching_instances_busy_ratio"] == 1.0
        capacity = held["batching_capacity_items_per_second"]
        assert capacity > 0
        assert held["batching_expected_wait_seconds"] == pytest.approx((6 + 2) / capacity)
        # The gauges stay put while nothing moves: they read the queue, not a rate.
        assert signals_of((await client.get("/metrics")).text) == held

        # A request that times out in the queue still counts until the collector drops it.
        late = asyncio.ensure_future(
            client.post("/", content=b"late", headers={"x-request-timeout-ms": "400"})
        )
        for _ in range(2000):
            found = signals_of((await client.get("/metrics")).text)
            if found["batching_queue_depth_requests"] == 4 or late.done():
                break
            await asyncio.sleep(0.002)
        late_status = (await late).status_code
        assert late_status in (503, 504)  # 503: refused at admission, never queued

        model.gate.set()
        assert (await holder).json()["outputs"][0]["input"] == "h1"
        assert [(await reply).status_code for reply in queued] == [200, 200, 200]
        drained = await wait_for_queue(client, 0)
        assert drained["batching_queue_depth_requests"] == 0
        assert drained["batching_inflight_items"] == 0
        assert drained["batching_instances_busy_ratio"] == 0
        assert drained["batching_expected_wait_seconds"] == 0


async def test_probes_and_metrics_answer_within_milliseconds_while_every_instance_is_busy() -> None:
    model = GatedModel()
    config = ModelConfig(
        name="echo",
        devices=("cpu", "cpu"),
        batching=BatchingConfig(max_batch_size=2, max_queue_size=4096, timeout=60.0),
    )
    async with running(app_with(model, config)) as url:
        limits = httpx.Limits(max_connections=200)
        async with (
            httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as load,
            httpx.AsyncClient(base_url=url, timeout=5) as probe,
        ):
            pending = [
                asyncio.ensure_future(load.post("/", json={"inputs": [f"x{i}", f"y{i}"]}))
                for i in range(100)
            ]
            for _ in range(2000):
                found = signals_of((await probe.get("/metrics")).text)
                if (
                    found["batching_instances_busy_ratio"] == 1.0
                    and found["batching_queue_depth_requests"] >= 90
                ):
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError(f"never saturated: {found}")
            timings: dict[str, list[float]] = {}
            for _ in range(20):
                for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
                    started = time.perf_counter()
                    response = await probe.get(path)
                    timings.setdefault(path, []).append(time.perf_counter() - started)
                    assert response.status_code == 200, (path, response.text)
            # Still saturated: nothing moved while the probes were answered.
            still = signals_of((await probe.get("/metrics")).text)
            assert still["batching_instances_busy_ratio"] == 1.0
            model.gate.set()
            replies = await asyncio.gather(*pending)
        assert [reply.status_code for reply in replies] == [200] * 100
    for path, seconds in timings.items():
        # Milliseconds on an idle machine; the bounds leave room for a loaded CI box.
        assert statistics.median(seconds) < 0.05, (path, seconds)
        assert max(seconds) < 0.5, (path, seconds)
