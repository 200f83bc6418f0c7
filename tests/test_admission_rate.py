"""Admission plans with the rate batches actually complete at: when batches go out late (the
event loop short of CPU under thousands of refusals a second), the compute rate overstates
what the instance delivers, and requests admitted at it only wait to miss their deadline.
On virtual time, so every figure is exact."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from batching.config import BatchingConfig
from batching.core.admission import Throughput
from batching.core.batcher import Batcher
from batching.core.policy import FixedPolicy
from batching.errors import DeadlineExceeded, Overloaded
from tests.support.fakes import run_virtual

MS = 0.001
FAR = math.inf
CAP = 32


def cost(n: int) -> float:
    return 5 * MS + 0.5 * MS * n


class LateRunner:
    """Computes in ``cost(n)`` and says so, but each batch ends ``slowdown`` times later: the
    time the starved event loop took to dispatch it and hand its results back."""

    def __init__(self, slowdown: float) -> None:
        self.slowdown = slowdown

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        compute = cost(len(inputs))
        await asyncio.sleep(compute * self.slowdown)
        return list(inputs), compute


def make(**settings: Any) -> Batcher:
    config = BatchingConfig(**{"max_batch_size": CAP, **settings})
    loop = asyncio.get_running_loop()
    batcher = Batcher(
        "m", config, FixedPolicy(config.max_queue_delay), clock=loop.time, rng=random.Random(0)
    )
    batcher.instances = batcher.ready_instances = 1
    return batcher


def test_the_rate_is_the_lower_of_compute_and_served() -> None:
    rate = Throughput(prior=1000.0)
    assert rate.per_instance == 1000.0  # nothing served yet: the compute rate
    rate.observe_served(100, 0.5)
    assert rate.per_instance == 200.0
    for _ in range(40):
        rate.observe(10, 0.1)  # compute slows to 100/s: now the lower one
    assert rate.computed < 200.0 and rate.per_instance == rate.computed
    rate.per_instance = 500.0  # set: both start over from it
    assert (rate.computed, rate.served, rate.per_instance) == (500.0, None, 500.0)
    rate.observe_served(0, 1.0)
    rate.observe_served(5, 0.0)
    assert rate.served is None


def test_a_backlogged_instance_teaches_the_rate_its_batches_complete_at() -> None:
    async def main() -> None:
        batcher = make()
        collector = asyncio.get_running_loop().create_task(batcher.serve(LateRunner(4.0).run))
        await batcher.submit(["x"] * 20 * CAP, deadline=FAR)  # 20 full batches, back to back
        throughput = batcher.throughput
        assert throughput.computed == pytest.approx(CAP / cost(CAP), rel=0.1)
        assert throughput.served is not None
        assert throughput.per_instance == pytest.approx(CAP / (4 * cost(CAP)), rel=0.1)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    run_virtual(main)


def test_idle_time_between_batches_is_not_taken_for_slowness() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = make()
        collector = loop.create_task(batcher.serve(LateRunner(1.0).run))
        for _ in range(20):  # full batches with a second of nothing between them
            await batcher.submit(["x"] * CAP, deadline=FAR)
            await asyncio.sleep(1.0)
        # No batch found work waiting when it ended: nothing served was learnt.
        assert batcher.throughput.served is None
        await batcher.submit(["x"] * 10 * CAP, deadline=FAR)
        assert batcher.throughput.per_instance == pytest.approx(CAP / cost(CAP), rel=0.1)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    run_virtual(main)


@pytest.mark.parametrize("slowdown", [1.0, 4.0])
def test_admitted_requests_meet_their_deadline_when_batches_go_out_late(
    slowdown: float,
) -> None:
    """Open-loop arrivals at 5x what the instance delivers, 0.5 s deadlines: every admitted
    request is answered in time, and the instance still serves near what it delivers."""
    deadline_s = 0.5
    seconds = 10.0

    async def main() -> tuple[Counter[str], float]:
        loop = asyncio.get_running_loop()
        batcher = make()
        batcher.throughput.per_instance = CAP / cost(CAP)  # as the compute rate has taught it
        collector = loop.create_task(batcher.serve(LateRunner(slowdown).run))
        delivered = CAP / (slowdown * cost(CAP))
        outcomes: Counter[str] = Counter()
        waits: list[asyncio.Task[None]] = []

        async def wait(pending: asyncio.Future[Any]) -> None:
            try:
                await pending
                outcomes["ok"] += 1
            except DeadlineExceeded:
                outcomes["deadline"] += 1

        arrivals = random.Random(1)
        while loop.time() < seconds:
            try:
                pending = batcher.submit(["t"], deadline=loop.time() + deadline_s)
            except Overloaded:
                outcomes["refused"] += 1
            else:
                waits.append(loop.create_task(wait(pending)))
            await asyncio.sleep(arrivals.expovariate(5 * delivered))
        await asyncio.gather(*waits)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        return outcomes, delivered

    outcomes, delivered = run_virtual(main)
    assert outcomes["deadline"] == 0, outcomes
    assert outcomes["ok"] / seconds >= 0.8 * delivered, (outcomes, delivered)
