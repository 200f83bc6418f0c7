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

from batching.core.admission import Throughput
from batching.core.batcher import Batcher
from batching.core.policy import FixedPolicy
from batching.errors import DeadlineExceeded, Overloaded
from batching.model_config import BatchingConfig
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


class SlowBatches:
    """Every batch computes in ``compute`` seconds (and says so) but ends ``seconds`` after it
    started, whatever its size: a model on cores that something else (a loop busy refusing a
    storm, other processes) keeps short."""

    def __init__(self, seconds: float, compute: float) -> None:
        self.seconds = seconds
        self.compute = compute

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        await asyncio.sleep(self.seconds)
        return list(inputs), self.compute


def test_a_request_behind_a_running_batch_is_admitted_only_if_that_batch_and_its_own_fit() -> None:
    """Batches that end 200 ms after they start, whatever their size, though their compute
    says 20 ms; 300 ms deadlines; about 10 requests per batch, too few for the rates to learn
    from. By the rates, nothing is ever ahead of a request; but one that arrives early in a
    running batch waits for the rest of it and then for its own, past its deadline. It is
    refused instead: none is admitted to time out, and the others are served."""
    deadline_s = 0.3
    seconds = 10.0

    async def main() -> Counter[str]:
        loop = asyncio.get_running_loop()
        batcher = make()
        batcher.throughput.per_instance = CAP / 0.02  # as the compute has taught it
        batcher.throughput.observe_batch(0.2)  # and the batches before
        collector = loop.create_task(batcher.serve(SlowBatches(0.2, 0.02).run))
        outcomes: Counter[str] = Counter()
        waits: list[asyncio.Task[None]] = []

        async def wait(pending: asyncio.Future[Any], deadline: float) -> None:
            try:
                await pending
            except DeadlineExceeded:
                outcomes["deadline"] += 1
            else:
                # The batcher drops what expires in the queue; the door times out the rest.
                outcomes["ok" if loop.time() <= deadline else "deadline"] += 1

        arrivals = random.Random(2)
        while loop.time() < seconds:
            deadline = loop.time() + deadline_s
            try:
                pending = batcher.submit(["t"], deadline=deadline)
            except Overloaded:
                outcomes["refused"] += 1
            else:
                waits.append(loop.create_task(wait(pending, deadline)))
            await asyncio.sleep(arrivals.expovariate(50))
        await asyncio.gather(*waits)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        return outcomes

    outcomes = run_virtual(main)
    assert outcomes["deadline"] == 0, outcomes
    assert outcomes["ok"] >= 0.3 * sum(outcomes.values()), outcomes


def test_the_return_line_places_each_refusal_behind_the_earlier_ones() -> None:
    from batching.core.admission import ReturnLine

    line = ReturnLine()
    assert line.join(1, capacity=100.0, now=0.0) == 0.0
    assert line.join(1, capacity=100.0, now=0.0) == pytest.approx(0.01)
    assert line.join(10, capacity=100.0, now=0.0) == pytest.approx(0.02)
    # 12 items in line, served at 100 per second: 0.05 s later, 7 are left ahead.
    assert line.join(1, capacity=100.0, now=0.05) == pytest.approx(0.07)
    assert line.join(1, capacity=100.0, now=10.0) == 0.0  # long drained


def test_a_storm_of_refusals_is_held_longer_the_later_it_joins_and_never_past_retry_after() -> None:
    from batching.core.admission import Admission

    class Events:
        def rejected(self, reason: str) -> None:
            pass

    config = BatchingConfig(max_batch_size=CAP, max_queue_size=64)
    admission = Admission("m", config, Events(), rng=random.Random(0))  # type: ignore[arg-type]
    admission.throughput.per_instance = 100.0
    holds: list[float] = []
    hints: list[float] = []
    for _ in range(200):  # 200 clients refused in the same instant: the queue is full
        with pytest.raises(Overloaded) as refused:
            admission.check(1, queued=64, running=CAP, instances=1, time_left=0.25, now=5.0)
        assert refused.value.hold is not None and refused.value.retry_after is not None
        holds.append(refused.value.hold)
        hints.append(refused.value.retry_after)
    assert all(hold <= hint for hold, hint in zip(holds, hints, strict=True))
    # Behind the ones refused before it: the 150th waits for the 149 ahead at 100 per second
    # (or its Retry-After, whichever is sooner), not one queue's drain time like the first.
    assert holds[149] >= min(hints[149], 1.49)
    assert holds[0] <= 2 * max(CAP, 64 - 64 * config.queue_close_ratio) / 100.0
