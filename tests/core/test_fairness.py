"""Fair queuing of large requests, and admission that cannot spiral under a retry storm: on
virtual time, so every figure here is exact and repeatable."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

from batching.core.admission import retry_after, spread
from batching.core.batcher import Batcher
from batching.core.policy import FixedPolicy
from batching.errors import Overloaded
from batching.model_config import BatchingConfig
from tests.support.fakes import ScriptedRunner, run_virtual

MS = 0.001
FAR = math.inf
CAP = 32


def cost(n: int) -> float:
    """A batch costs a fixed 5 ms plus 0.5 ms per item, as a small encoder on a CPU does."""
    return 5 * MS + 0.5 * MS * n


def make(seed: int = 0, **settings: Any) -> Batcher:
    config = BatchingConfig(**{"max_batch_size": CAP, **settings})
    clock = asyncio.get_running_loop().time
    batcher = Batcher(
        "m", config, FixedPolicy(config.max_queue_delay), clock=clock, rng=random.Random(seed)
    )
    batcher.instances = batcher.ready_instances = 1
    return batcher


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


async def closed_loop(
    batcher: Batcher, items: int, until: float, latencies: list[float], counted: list[int]
) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        started = loop.time()
        outputs = await batcher.submit(["x"] * items, deadline=FAR)
        if loop.time() <= until:
            latencies.append(loop.time() - started)
            counted[0] += len(outputs)


def big_and_small(small_clients: int, seconds: float = 5.0) -> tuple[float, list[float]]:
    """Items/s the 1,024-item client gets, and the single-text clients' latencies."""

    async def main() -> tuple[float, list[float]]:
        batcher = make()
        runner = ScriptedRunner(cost=cost)
        collector = asyncio.get_running_loop().create_task(batcher.serve(runner.run))
        big: list[int] = [0]
        small: list[float] = []
        clients = [closed_loop(batcher, 1024, seconds, [], big)]
        clients += [closed_loop(batcher, 1, seconds, small, [0]) for _ in range(small_clients)]
        await asyncio.gather(*clients)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        return big[0] / seconds, small

    return run_virtual(main)


def test_a_single_text_behind_a_1024_item_request_runs_in_the_next_batch() -> None:
    async def main() -> None:
        batcher = make()
        runner = ScriptedRunner(cost=cost)
        collector = asyncio.get_running_loop().create_task(batcher.serve(runner.run))
        big = batcher.submit([f"b{i}" for i in range(1024)], deadline=FAR)
        await runner.started.wait()  # the first 32 of the big request are running
        single = batcher.submit(["single"], deadline=FAR)
        assert await single == ["single"]
        # Batch 0 was the big request's first turn; the single text is in batch 1, not 33.
        holding = [i for i, (_, inputs) in enumerate(runner.batches) if "single" in inputs]
        assert holding == [1]
        assert runner.batches[1][1][0] == "single"
        assert await big == [f"b{i}" for i in range(1024)]
        assert all(size <= CAP for size in runner.sizes)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    run_virtual(main)


def test_two_large_requests_take_turns_and_small_ones_stay_first_come_first_served() -> None:
    async def main() -> None:
        batcher = make(max_batch_size=4)
        runner = ScriptedRunner(cost=cost)
        collector = asyncio.get_running_loop().create_task(batcher.serve(runner.run))
        first = batcher.submit(["held"], deadline=FAR)
        await runner.started.wait()
        a = batcher.submit([f"a{i}" for i in range(8)], deadline=FAR)
        b = batcher.submit([f"b{i}" for i in range(8)], deadline=FAR)
        smalls = [batcher.submit([f"s{i}"], deadline=FAR) for i in range(3)]
        await asyncio.gather(first, a, b, *smalls)
        assert [inputs for _, inputs in runner.batches] == [
            ["held"],
            ["a0", "a1", "a2", "a3"],
            ["b0", "b1", "b2", "b3"],
            ["s0", "s1", "s2", "a4"],
            ["b4", "b5", "b6", "b7"],
            ["a5", "a6", "a7"],
        ]
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    run_virtual(main)


def test_single_text_p99_stays_low_and_the_big_client_keeps_over_half_its_solo_rate() -> None:
    solo, _ = big_and_small(small_clients=0)
    shared, latencies = big_and_small(small_clients=16)
    assert shared >= 0.5 * solo, (shared, solo)
    # One batch of 32 costs 21 ms: a single text waits at most for the running batch and
    # one more, never for the 32 batches of a 1,024-item request.
    assert percentile(latencies, 99) <= 3 * cost(CAP), percentile(latencies, 99)
    assert len(latencies) > 1000


def test_the_token_cap_and_length_grouping_still_hold_with_fair_queuing() -> None:
    async def main() -> None:
        batcher = make(max_batch_size=8, max_batch_tokens=64)
        runner = ScriptedRunner(cost=cost)
        collector = asyncio.get_running_loop().create_task(batcher.serve(runner.run))
        held = batcher.submit(["held"], deadline=FAR, tokens=[8])
        await runner.started.wait()
        long = batcher.submit([f"L{i}" for i in range(20)], deadline=FAR, tokens=[16] * 20)
        short = batcher.submit(["s"], deadline=FAR, tokens=[2])
        assert await short == ["s"]
        await asyncio.gather(held, long)
        for _, inputs in runner.batches:
            lengths = [16 if item.startswith("L") else 2 for item in inputs if item != "held"]
            assert len(lengths) * max(lengths, default=0) <= 64
        # The short text ran within the first three batches, not after all of the long one.
        assert any("s" in inputs for _, inputs in runner.batches[:3])
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    run_virtual(main)


# ------------------------------------------------------------------------- retry storms


def test_throughput_learns_only_from_batches_that_show_a_busy_instance() -> None:
    async def main() -> None:
        batcher = make()
        runner = ScriptedRunner(cost=cost)
        collector = asyncio.get_running_loop().create_task(batcher.serve(runner.run))
        batcher.throughput.per_instance = 1000.0
        for _ in range(50):  # one at a time: batches of one, 200 items/s each
            await batcher.submit(["one"], deadline=FAR)
        assert batcher.throughput.per_instance == 1000.0
        await batcher.submit(["x"] * 320, deadline=FAR)  # full batches: 32 / 21 ms
        assert batcher.throughput.per_instance == pytest.approx(CAP / cost(CAP), rel=0.15)
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)

    run_virtual(main)


def test_refusals_never_change_the_throughput_estimate() -> None:
    async def main() -> None:
        batcher = make(max_queue_size=4)
        batcher.throughput.per_instance = 500.0
        for i in range(4):
            batcher.submit([i], deadline=FAR)  # no collector: the queue only fills
        for _ in range(100):
            with pytest.raises(Overloaded):
                batcher.submit(["again"], deadline=FAR)
        assert batcher.throughput.per_instance == 500.0

    run_virtual(main)


def test_a_request_that_joins_the_next_batch_is_not_held_to_the_margin() -> None:
    async def main() -> None:
        batcher = make()
        batcher.throughput.per_instance = 100.0
        for i in range(15):
            batcher.submit([i], deadline=FAR)
        # 16 items at 100/s is 0.16 s: it fits a 0.25 s deadline, though not twice over.
        batcher.submit(["fits"], deadline=0.25)
        with pytest.raises(Overloaded, match="before its deadline"):
            batcher.submit(["late"], deadline=0.1)
        for i in range(40):
            batcher.submit([i], deadline=FAR)
        # Beyond one batch the margin applies: 57 items at 100/s, twice over, is past 1 s.
        with pytest.raises(Overloaded):
            batcher.submit(["deep"], deadline=1.0)

    run_virtual(main)


def storm(
    clients: int, seconds: float, deadline_s: float, retry: bool
) -> tuple[float, float, Batcher]:
    """``clients`` closed-loop one-text clients for ``seconds``; refused ones retry after
    1 ms (a round trip) when ``retry``, else after the Retry-After hint. Returns goodput
    (answers/s), the time after the storm until a polite request is admitted, the batcher."""

    async def main() -> tuple[float, float, Batcher]:
        loop = asyncio.get_running_loop()
        batcher = make(max_queue_delay=2 * MS)
        batcher.throughput.per_instance = CAP / cost(CAP)
        runner = ScriptedRunner(cost=cost)
        collector = loop.create_task(batcher.serve(runner.run))
        served = [0]

        async def client() -> None:
            while loop.time() < seconds:
                try:
                    await batcher.submit(["t"], deadline=loop.time() + deadline_s)
                except Overloaded as refused:
                    await asyncio.sleep(1 * MS if retry else refused.retry_after)
                    continue
                except Exception:
                    continue
                if loop.time() <= seconds:
                    served[0] += 1

        await asyncio.gather(*(client() for _ in range(clients)))
        storm_end = loop.time()
        while True:
            try:
                await batcher.submit(["polite"], deadline=loop.time() + deadline_s)
                break
            except Overloaded:
                await asyncio.sleep(10 * MS)
        recovered = loop.time() - storm_end
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
        return served[0] / seconds, recovered, batcher

    return run_virtual(main)


@pytest.mark.parametrize("deadline_s", [30.0, 0.25])
def test_a_retry_storm_keeps_goodput_and_admission_recovers_at_once(deadline_s: float) -> None:
    capacity, _, _ = storm(256, 3.0, deadline_s, retry=False)
    goodput, recovered, batcher = storm(256, 3.0, deadline_s, retry=True)
    assert goodput >= 0.8 * capacity, (goodput, capacity)
    assert recovered <= 0.1, recovered
    # The estimate is still what full batches showed, not dragged down by the storm.
    assert batcher.throughput.per_instance == pytest.approx(CAP / cost(CAP), rel=0.15)


def test_retry_after_is_spread_between_the_drain_time_and_twice_it() -> None:
    rng = random.Random(7)
    base = retry_after(3000, 1000.0)
    assert base == 3.0
    hints = [spread(base, rng) for _ in range(1000)]
    assert min(hints) >= 3.0 and max(hints) < 6.0
    # Spread out, not synchronised: every half-second bucket of [3, 6) is used, evenly.
    buckets = [sum(1 for h in hints if 3 + k / 2 <= h < 3.5 + k / 2) for k in range(6)]
    assert min(buckets) > 120, buckets


def test_refused_requests_carry_spread_hints_from_the_injected_generator() -> None:
    async def main() -> list[float]:
        batcher = make(seed=3, max_queue_size=4)
        for i in range(4):
            batcher.submit([i], deadline=FAR)
        hints = []
        for _ in range(20):
            with pytest.raises(Overloaded) as refused:
                batcher.submit(["x"], deadline=FAR)
            hints.append(refused.value.retry_after)
        return hints

    first, again = run_virtual(main), run_virtual(main)
    assert first == again  # seeded: repeatable
    assert len(set(first)) == 20 and all(1.0 <= h < 2.0 for h in first)
