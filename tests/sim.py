"""A deterministic discrete-event simulation of a model's instances and their collectors.

Simulated time only: no clock, no sleep, no threads, so a policy comparison is a fast,
reproducible unit test. Each collector follows the semantics of ``batching/batcher.py``:

- when its instance is free it takes the first queued job (waiting for one if the queue is
  empty); the window starts at that job's enqueue time;
- it drains whatever else is queued, up to ``max_batch_size`` items; ``backlog`` is True when
  other jobs were queued behind the first one;
- while the batch is not full it asks ``policy.max_delay`` and waits for arrivals until
  ``oldest + min(max_delay, max_queue_delay)``, re-asking after every arrival;
- every admission calls ``observe_arrival`` and every finished batch ``observe_batch``.

With several instances, an arrival goes to the collector that has waited on the queue the
longest, as asyncio's FIFO getters do: an idle collector (waiting for a first job) has been
waiting since its instance came free, so it wins over one that re-awaits mid-formation.

Each job carries one item. Arrivals are open-loop Poisson or closed-loop clients that send
their next request ``think_s`` after their previous answer. Instances do not slow each other
down: the cost of a batch depends only on its size.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from batching.policy import BatchPolicy, Formation

__all__ = ["SimResult", "linear_cost", "simulate"]

_ARRIVAL = 0
_DEADLINE = 1
_FINISH = 2


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


@dataclass(slots=True)
class _Instance:
    index: int
    #: "idle" (awaiting a first job), "forming" (awaiting more) or "busy" (computing).
    state: str = "idle"
    batch: list[float] = field(default_factory=list)
    backlog: bool = False
    #: Order in which this collector last started awaiting the queue; lowest is served first.
    getter_order: int = 0
    #: Bumped on every dispatch so a stale deadline event is ignored.
    generation: int = 0


class _Sim:
    def __init__(
        self,
        policy: BatchPolicy,
        *,
        max_queue_delay: float,
        max_batch_size: int,
        cost: Callable[[int], float],
        instances: int,
        jobs: int,
        think_s: float,
    ) -> None:
        self.policy = policy
        self.max_queue_delay = max_queue_delay
        self.max_batch_size = max_batch_size
        self.cost = cost
        self.jobs = jobs
        self.think_s = think_s
        self.closed_loop = False
        self.instances = [_Instance(i) for i in range(instances)]
        self.queue: deque[float] = deque()
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.latencies: list[float] = []
        self.finish_times: list[float] = []
        self.batch_sizes: list[int] = []
        self.issued = 0
        for inst in self.instances:
            inst.getter_order = self._next_seq()

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(self.events, (at, self._next_seq(), kind, a, b))

    def run(self) -> None:
        while self.events and len(self.latencies) < self.jobs:
            at, _, kind, a, b = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                self.arrive(at)
            elif kind == _DEADLINE:
                inst = self.instances[a]
                if inst.state == "forming" and inst.generation == b:
                    self.dispatch(inst, at)
            else:
                self.finish(self.instances[a], at)

    def arrive(self, now: float) -> None:
        self.policy.observe_arrival(now, 1)
        waiting = [i for i in self.instances if i.state != "busy"]
        if not waiting:
            self.queue.append(now)
            return
        inst = min(waiting, key=lambda i: i.getter_order)
        if inst.state == "idle":
            inst.batch = [now]
            inst.backlog = False
        else:
            inst.batch.append(now)
        self.decide(inst, now)

    def take(self, inst: _Instance, now: float) -> None:
        inst.batch = [self.queue.popleft()]
        inst.backlog = bool(self.queue)
        while self.queue and len(inst.batch) < self.max_batch_size:
            inst.batch.append(self.queue.popleft())
        self.decide(inst, now)

    def decide(self, inst: _Instance, now: float) -> None:
        if len(inst.batch) >= self.max_batch_size:
            self.dispatch(inst, now)
            return
        busy = sum(1 for i in self.instances if i.state == "busy")
        formation = Formation(
            now=now,
            oldest_enqueued_at=inst.batch[0],
            batch_items=len(inst.batch),
            batch_tokens=0,
            max_batch_size=self.max_batch_size,
            backlog=inst.backlog,
            busy_instances=busy,
            instances=len(self.instances),
        )
        delay = min(self.policy.max_delay(formation), self.max_queue_delay)
        deadline = inst.batch[0] + delay
        if deadline <= now:
            self.dispatch(inst, now)
            return
        inst.state = "forming"
        inst.getter_order = self._next_seq()
        self.push(deadline, _DEADLINE, inst.index, inst.generation)

    def dispatch(self, inst: _Instance, now: float) -> None:
        inst.state = "busy"
        inst.generation += 1
        self.push(now + self.cost(len(inst.batch)), _FINISH, inst.index)

    def finish(self, inst: _Instance, now: float) -> None:
        n = len(inst.batch)
        self.policy.observe_batch(n, 0, self.cost(n))
        self.batch_sizes.append(n)
        for enqueued in inst.batch:
            self.latencies.append(now - enqueued)
            self.finish_times.append(now)
            if self.closed_loop and self.issued < self.jobs:
                self.push(now + self.think_s, _ARRIVAL)
                self.issued += 1
        inst.batch = []
        if self.queue:
            self.take(inst, now)
        else:
            inst.state = "idle"
            inst.getter_order = self._next_seq()


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
    """Serve ``jobs`` jobs and measure their latency.

    Give ``rate_per_s`` for open-loop Poisson arrivals, or ``clients`` for a closed loop.
    The first ``warmup_jobs`` finished jobs are left out of the figures, so the policy's
    estimators start from a loaded system rather than from their priors.
    """
    if (rate_per_s is None) == (clients is None):
        raise ValueError("give exactly one of rate_per_s and clients")
    if jobs <= warmup_jobs:
        raise ValueError("warmup_jobs leaves nothing to measure")
    rng = random.Random(seed)
    sim = _Sim(
        policy,
        max_queue_delay=max_queue_delay,
        max_batch_size=max_batch_size,
        cost=cost,
        instances=instances,
        jobs=jobs,
        think_s=think_s,
    )
    if rate_per_s is not None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be > 0")
        # Open loop: arrivals never depend on service, so schedule them all up front.
        t = 0.0
        for _ in range(jobs):
            t += rng.expovariate(rate_per_s)
            sim.push(t, _ARRIVAL)
        sim.issued = jobs
    else:
        assert clients is not None
        sim.closed_loop = True
        # Stagger the clients' first requests so they do not all land at one instant.
        for _ in range(clients):
            sim.push(rng.uniform(0.0, 0.001), _ARRIVAL)
        sim.issued = clients
    sim.run()

    measured = sorted(sim.latencies[warmup_jobs:])
    p99 = measured[min(len(measured) - 1, math.ceil(0.99 * len(measured)) - 1)]
    span = sim.finish_times[-1] - sim.finish_times[warmup_jobs - 1 if warmup_jobs else 0]
    return SimResult(
        mean_latency_s=sum(measured) / len(measured),
        p99_latency_s=p99,
        throughput_per_s=len(measured) / span if span > 0 else math.inf,
        mean_batch_items=sum(sim.batch_sizes) / len(sim.batch_sizes),
        jobs=len(measured),
    )
