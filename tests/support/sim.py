"""A deterministic simulation of a model's instances, driving the real batcher in virtual time.

The jobs go through :class:`batching.core.batcher.Batcher` itself (its queue, collectors and
formation, asking the policy under test), on :class:`~tests.support.fakes.VirtualTimeLoop`,
whose clock jumps whenever every task waits. Nothing reads a wall clock or sleeps for real,
so a policy comparison is a fast, reproducible unit test that cannot drift from the batcher:
whatever the collectors do, the figures measure.

Each simulated instance is a collector (``Batcher.serve``) whose ``run`` takes ``cost(n)``
seconds of virtual time for a batch of ``n`` items and answers every item. Instances do not
slow each other down: the cost of a batch depends only on its size.

Each job carries one item. Arrivals are open-loop Poisson (scheduled up front at their
arrival times) or closed-loop clients that send their next request ``think_s`` after their
previous answer.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batching.core.batcher import Batcher
from batching.core.batching_config import BatchingConfig
from batching.core.policy import BatchPolicy
from tests.support.fakes import VirtualTimeLoop

__all__ = ["SimResult", "linear_cost", "simulate"]

#: Virtual seconds after which a run that has not served every job is declared stuck.
_STUCK_AFTER_S = 1e6


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one simulation run measured (after the warm-up jobs)."""

    mean_latency_s: float
    p99_latency_s: float
    throughput_per_s: float
    mean_batch_items: float
    jobs: int


def linear_cost(fixed_s: float, per_item_s: float) -> Callable[[int], float]:
    """The batch cost ``fixed_s + per_item_s * n``."""

    def cost(items: int) -> float:
        return fixed_s + per_item_s * items

    return cost


class _Recorder:
    """The batcher's events observer: counts batch sizes and fails on anything dropped."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.problems: list[str] = []

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None:
        self.batch_sizes.append(items)

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        return None

    def rejected(self, reason: str) -> None:
        self.problems.append(f"rejected: {reason}")

    def dropped(self, reason: str, items: int) -> None:
        self.problems.append(f"dropped {items}: {reason}")


class _Run:
    """One simulation: the batcher, its instances, and what the jobs measured."""

    def __init__(
        self,
        policy: BatchPolicy,
        *,
        max_queue_delay: float,
        max_batch_size: int,
        cost: Callable[[int], float],
        instances: int,
        jobs: int,
    ) -> None:
        self.cost = cost
        self.instances = instances
        self.jobs = jobs
        self.events = _Recorder()
        config = BatchingConfig(
            max_batch_size=max_batch_size,
            max_queue_delay=max_queue_delay,
            # Neither the queue bound nor a deadline may refuse or drop a simulated job.
            max_queue_size=jobs + 1,
            timeout=max(1.0, 2 * max_queue_delay),
            max_items_per_request=1,
        )
        self.batcher = Batcher("sim", config, policy, self.events)
        self.latencies: list[float] = []
        self.finish_times: list[float] = []
        self.issued = 0
        self.failure: BaseException | None = None
        self.finished = asyncio.Event()

    async def run_batch(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        compute_s = self.cost(len(inputs))
        await asyncio.sleep(compute_s)  # the model's compute, in virtual time
        return inputs, compute_s

    def fail(self, exc: BaseException) -> None:
        """End the run: a job was refused or failed, so the figures would mean nothing."""
        if self.failure is None:
            self.failure = exc
        self.finished.set()

    def arrive(self) -> None:
        """An open-loop arrival: submit one job and leave it to be answered."""
        try:
            self.submit()
        except Exception as exc:
            self.fail(exc)

    def submit(self) -> asyncio.Future[list[Any]]:
        """Submit one single-item job now; its latency is recorded when it is answered."""
        loop = asyncio.get_running_loop()
        enqueued = loop.time()
        future = self.batcher.submit([self.issued], deadline=math.inf)
        self.issued += 1

        def answered(done: asyncio.Future[list[Any]]) -> None:
            if done.cancelled():
                self.fail(RuntimeError("a simulated job was cancelled"))
                return
            exc = done.exception()
            if exc is not None:
                self.fail(exc)
                return
            now = loop.time()
            self.latencies.append(now - enqueued)
            self.finish_times.append(now)
            if len(self.latencies) >= self.jobs:
                self.finished.set()

        future.add_done_callback(answered)
        return future

    async def client(self, first_at: float, think_s: float) -> None:
        """A closed-loop client: a request at ``first_at``, the next ``think_s`` after each
        answer, while the run still has jobs to issue."""
        await asyncio.sleep(first_at)
        try:
            while True:
                await self.submit()
                if self.issued >= self.jobs:
                    return
                await asyncio.sleep(think_s)
        except Exception as exc:
            self.fail(exc)

    async def serve(self, start: Callable[[_Run], list[asyncio.Task[None]]]) -> None:
        batcher = self.batcher
        batcher.instances = self.instances
        batcher.ready_instances = self.instances
        collectors = [
            asyncio.create_task(batcher.serve(self.run_batch), name=f"sim-{index}")
            for index in range(self.instances)
        ]
        drivers = start(self)
        try:
            async with asyncio.timeout(_STUCK_AFTER_S):
                await self.finished.wait()
        except TimeoutError:
            crashed = [
                task.exception() for task in collectors if task.done() and not task.cancelled()
            ]
            raise AssertionError(
                f"the simulation served {len(self.latencies)} of {self.jobs} jobs and then "
                f"stopped; collectors that crashed: {crashed!r}"
            ) from (crashed[0] if crashed else None)
        finally:
            for task in collectors + drivers:
                task.cancel()
            await asyncio.gather(*collectors, *drivers, return_exceptions=True)
        if self.failure is not None:
            raise AssertionError(f"a simulated job failed: {self.failure!r}")
        if self.events.problems:
            raise AssertionError(f"the batcher refused or dropped jobs: {self.events.problems}")


def simulate(
    policy: BatchPolicy,
    *,
    max_queue_delay: float,
    max_batch_size: int,
    cost: Callable[[int], float],
    jobs: int,
    seed: int,
    rate_per_s: float | None = None,
    clients: int | None = None,
    think_s: float = 0.0,
    instances: int = 1,
    warmup_jobs: int = 0,
) -> SimResult:
    """Serve ``jobs`` jobs through a real :class:`Batcher` and measure their latency.

    Give ``rate_per_s`` for open-loop Poisson arrivals, or ``clients`` for a closed loop.
    The first ``warmup_jobs`` finished jobs are left out of the figures, so the policy's
    estimators start from a loaded system rather than from their priors.
    """
    if (rate_per_s is None) == (clients is None):
        raise ValueError("give exactly one of rate_per_s and clients")
    if jobs <= warmup_jobs:
        raise ValueError("warmup_jobs leaves nothing to measure")
    if rate_per_s is not None and rate_per_s <= 0:
        raise ValueError("rate_per_s must be > 0")
    rng = random.Random(seed)

    def start(run: _Run) -> list[asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        if rate_per_s is not None:
            # Open loop: arrivals never depend on service. Each one schedules the next (the
            # loop's timer heap stays small), at Poisson-spaced times.
            def arrive(at: float, left: int) -> None:
                run.arrive()
                if left > 1:
                    at += rng.expovariate(rate_per_s)
                    loop.call_at(at, arrive, at, left - 1)

            first = rng.expovariate(rate_per_s)
            loop.call_at(first, arrive, first, jobs)
            return []
        assert clients is not None
        # Stagger the clients' first requests so they do not all land at one instant.
        return [
            asyncio.create_task(run.client(rng.uniform(0.0, 0.001), think_s))
            for _ in range(clients)
        ]

    async def main() -> _Run:
        run = _Run(
            policy,
            max_queue_delay=max_queue_delay,
            max_batch_size=max_batch_size,
            cost=cost,
            instances=instances,
            jobs=jobs,
        )
        await run.serve(start)
        return run

    loop = VirtualTimeLoop()
    try:
        run = loop.run_until_complete(main())
    finally:
        loop.close()

    measured = sorted(run.latencies[warmup_jobs:])
    p99 = measured[min(len(measured) - 1, math.ceil(0.99 * len(measured)) - 1)]
    span = run.finish_times[-1] - run.finish_times[warmup_jobs - 1 if warmup_jobs else 0]
    return SimResult(
        mean_latency_s=sum(measured) / len(measured),
        p99_latency_s=p99,
        throughput_per_s=len(measured) / span if span > 0 else math.inf,
        mean_batch_items=sum(run.events.batch_sizes) / len(run.events.batch_sizes),
        jobs=len(measured),
    )
