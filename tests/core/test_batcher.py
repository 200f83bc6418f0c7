"""Batch formation, splitting, resolution and admission, on virtual time (no threads, no sleeps
standing in for synchronisation: the loop's clock jumps only when every task waits)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest

from batching.core.batcher import Batcher, InstanceLost
from batching.core.events import BatchRun, RequestRun
from batching.core.policy import FixedPolicy
from batching.errors import DeadlineExceeded, InferenceFailed, NotReady, Overloaded, PayloadTooLarge
from batching.model_config import BatchingConfig
from tests.support.fakes import ScriptedRunner, at, run_virtual

MS = 0.001
FAR = math.inf


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, str]] = []
        self.rejections: list[str] = []
        self.drops: list[tuple[str, int]] = []
        self.requests: list[tuple[float, float, float, bool]] = []

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None:
        self.batches.append((items, tokens, reason))

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        self.requests.append((queue_s, compute_s, total_s, ok))

    def rejected(self, reason: str) -> None:
        self.rejections.append(reason)

    def dropped(self, reason: str, items: int) -> None:
        self.drops.append((reason, items))

    @property
    def reasons(self) -> list[str]:
        return [reason for _, _, reason in self.batches]


def make_batcher(instances: int = 1, **settings: Any) -> tuple[Batcher, Recorder]:
    config = BatchingConfig(**settings)
    events = Recorder()
    # Requests are timed on the virtual clock too, so their reported times are exact.
    clock = asyncio.get_running_loop().time
    batcher = Batcher("m", config, FixedPolicy(config.max_queue_delay), events, clock=clock)
    batcher.instances = instances
    batcher.ready_instances = instances
    return batcher, events


def serve(batcher: Batcher, runner: ScriptedRunner) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(batcher.serve(runner.run))


async def occupy(batcher: Batcher, runner: ScriptedRunner) -> asyncio.Future[list[Any]]:
    """Submit one job and return once the instance is running it, so later jobs queue."""
    future = batcher.submit(["busy"], deadline=FAR)
    await runner.started.wait()
    return future


async def finish(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_lone_request_at_idle_goes_out_at_once() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_queue_delay=5 * MS)
        runner = ScriptedRunner()
        task = serve(batcher, runner)
        await at(1 * MS)
        result = await batcher.submit(["a"], deadline=FAR)
        assert result == ["a"]
        assert runner.batches == [(1 * MS, ["a"])]
        assert events.reasons == ["instance_free"]
        await finish(task)

    run_virtual(main)


def test_jobs_queued_while_busy_form_the_next_batch_the_moment_it_is_free() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_queue_delay=5 * MS)
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        task = serve(batcher, runner)
        first = batcher.submit(["first"], deadline=FAR)
        await at(1 * MS)
        rest = [batcher.submit([f"r{i}"], deadline=FAR) for i in range(3)]
        await asyncio.gather(first, *rest)
        # The window ran from the oldest queued job (t=1 ms) and had passed by t=10 ms.
        assert runner.batches == [(0.0, ["first"]), (10 * MS, ["r0", "r1", "r2"])]
        assert events.reasons == ["instance_free", "deadline"]
        await finish(task)

    run_virtual(main)


def test_the_window_is_one_deadline_from_the_oldest_job_not_a_timeout_per_get() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_queue_delay=5 * MS, max_batch_size=64)
        runner = ScriptedRunner(cost=lambda n: 1 * MS if n == 1 else 0.0)
        task = serve(batcher, runner)
        futures = [batcher.submit(["busy"], deadline=FAR)]
        await at(0.5 * MS)
        futures.append(batcher.submit(["oldest"], deadline=FAR))  # window: 0.5 .. 5.5 ms
        futures.append(batcher.submit(["second"], deadline=FAR))
        # Arrivals every 2 ms: a timeout restarted on each get would never fire.
        for step, when in enumerate((2.5, 4.5, 6.5, 8.5)):
            await at(when * MS)
            futures.append(batcher.submit([f"late{step}"], deadline=FAR))
        await asyncio.gather(*futures)
        starts = [when for when, _ in runner.batches]
        assert runner.batches[1] == (5.5 * MS, ["oldest", "second", "late0", "late1"])
        assert starts[1] == pytest.approx(5.5 * MS)
        assert events.reasons[:2] == ["instance_free", "deadline"]
        await finish(task)

    run_virtual(main)


def test_batches_never_exceed_the_item_cap() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=8, max_queue_delay=5 * MS)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        futures = [batcher.submit([i], deadline=FAR) for i in range(9)]
        assert await asyncio.gather(*futures) == [[i] for i in range(9)]
        await blocker
        assert runner.sizes == [1, 8, 1]
        # The last job was alone in the queue when the instance freed: no reason to wait.
        assert events.reasons == ["instance_free", "full", "instance_free"]
        await finish(task)

    run_virtual(main)


def test_a_request_larger_than_the_cap_is_split_and_rejoined_in_order() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=8)
        runner = ScriptedRunner(transform=lambda item: item * 10)
        task = serve(batcher, runner)
        result = await batcher.submit(list(range(20)), deadline=FAR)
        assert result == [i * 10 for i in range(20)]
        assert runner.sizes == [8, 8, 4]
        await finish(task)

    run_virtual(main)


def test_a_request_that_overflows_the_forming_batch_fills_it_and_carries_over() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=8)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        small = batcher.submit(["a", "b", "c"], deadline=FAR)
        large = batcher.submit([f"L{i}" for i in range(7)], deadline=FAR)
        after = batcher.submit(["z"], deadline=FAR)
        assert await small == ["a", "b", "c"]
        assert await large == [f"L{i}" for i in range(7)]
        assert await after == ["z"]
        await blocker
        # The carried-over rest goes round behind what was queued meanwhile (fair queuing).
        assert [inputs for _, inputs in runner.batches] == [
            ["busy"],
            ["a", "b", "c", "L0", "L1", "L2", "L3", "L4"],
            ["z", "L5", "L6"],
        ]
        await finish(task)

    run_virtual(main)


def test_each_caller_gets_exactly_its_own_outputs() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=16)
        runner = ScriptedRunner(cost=lambda n: 2 * MS, transform=lambda item: f"out:{item}")
        task = serve(batcher, runner)
        requests = {
            name: [f"{name}{i}" for i in range(size)]
            for name, size in (("a", 1), ("b", 5), ("c", 2), ("d", 12), ("e", 3))
        }
        futures = {name: batcher.submit(items, deadline=FAR) for name, items in requests.items()}
        for name, future in futures.items():
            assert await future == [f"out:{item}" for item in requests[name]]
        assert max(runner.sizes) <= 16
        await finish(task)

    run_virtual(main)


def test_preferred_batch_size_goes_out_before_the_window_closes() -> None:
    async def main() -> None:
        batcher, events = make_batcher(
            max_batch_size=16, max_queue_delay=50 * MS, preferred_batch_sizes=(4,)
        )
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        futures = [batcher.submit(["a"], deadline=FAR), batcher.submit(["b"], deadline=FAR)]
        await at(1.5 * MS)
        futures.append(batcher.submit(["c"], deadline=FAR))
        await at(3 * MS)
        futures.append(batcher.submit(["d"], deadline=FAR))
        await asyncio.gather(blocker, *futures)
        assert runner.batches[1] == (3 * MS, ["a", "b", "c", "d"])
        assert events.reasons[1] == "preferred_size"
        await finish(task)

    run_virtual(main)


def test_the_token_cap_limits_padded_size() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=32, max_batch_tokens=100)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = batcher.submit(["x"], deadline=FAR, tokens=[5])
        await runner.started.wait()
        short = batcher.submit(["s"] * 6, deadline=FAR, tokens=[10] * 6)
        long = batcher.submit(["l"] * 3, deadline=FAR, tokens=[40] * 3)
        await asyncio.gather(blocker, short, long)
        # 6 x 10 fits; a 40-token item would make it 7 x 40 = 280 > 100; two of them 2 x 40.
        assert runner.sizes == [1, 6, 2, 1]
        assert [tokens for _, tokens, _ in events.batches] == [5, 60, 80, 40]
        await finish(task)

    run_virtual(main)


def test_the_model_output_count_is_checked() -> None:
    async def main() -> None:
        batcher, _ = make_batcher()

        async def short_run(inputs: list[Any]) -> tuple[Sequence[Any], float]:
            return inputs[:-1], 0.0

        task = asyncio.get_running_loop().create_task(batcher.serve(short_run))
        with pytest.raises(InferenceFailed, match="wrong number of outputs"):
            await batcher.submit(["a", "b"], deadline=FAR)
        await finish(task)

    run_virtual(main)


def test_a_poisoned_item_fails_only_its_own_request() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=16)
        runs: list[list[Any]] = []
        started = asyncio.Event()

        async def fragile(inputs: list[Any]) -> tuple[Sequence[Any], float]:
            runs.append(list(inputs))
            started.set()
            await asyncio.sleep(1 * MS)
            if "poison" in inputs:
                raise ValueError("bad input")
            return [item.upper() for item in inputs], 1 * MS

        task = asyncio.get_running_loop().create_task(batcher.serve(fragile))
        blocker = batcher.submit(["x"], deadline=FAR)
        await started.wait()
        good = [batcher.submit([f"g{i}"], deadline=FAR) for i in range(5)]
        bad = batcher.submit(["ok", "poison"], deadline=FAR)
        more = [batcher.submit([f"h{i}"], deadline=FAR) for i in range(2)]
        await blocker
        for index, future in enumerate(good):
            assert await future == [f"G{index}"]
        for index, future in enumerate(more):
            assert await future == [f"H{index}"]
        with pytest.raises(InferenceFailed):
            await bad
        assert runs[1] == ["g0", "g1", "g2", "g3", "g4", "ok", "poison", "h0", "h1"]
        await finish(task)

    run_virtual(main)


def test_cancelled_requests_never_reach_the_model() -> None:
    async def main() -> None:
        batcher, events = make_batcher()
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        gone = batcher.submit(["gone", "gone"], deadline=FAR)
        kept = batcher.submit(["kept"], deadline=FAR)
        await at(1 * MS)
        gone.cancel()
        assert await kept == ["kept"]
        await blocker
        assert [inputs for _, inputs in runner.batches] == [["busy"], ["kept"]]
        assert events.drops == [("cancelled", 2)]
        await finish(task)

    run_virtual(main)


def test_an_expired_request_is_answered_504_and_never_computed() -> None:
    async def main() -> None:
        batcher, events = make_batcher()
        batcher.throughput.per_instance = 1e6  # admission expects it in time; the model is slow
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        late = batcher.submit(["late"], deadline=5 * MS)
        with pytest.raises(DeadlineExceeded):
            await late
        await blocker
        assert [inputs for _, inputs in runner.batches] == [["busy"]]
        assert events.drops == [("deadline", 1)]
        await finish(task)

    run_virtual(main)


def test_a_full_queue_is_refused_at_once_with_retry_after_and_hysteresis() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_queue_size=10, queue_close_ratio=0.5)
        runner = ScriptedRunner()
        runner.gate = asyncio.Event()
        task = serve(batcher, runner)
        futures = [await occupy(batcher, runner)]
        futures += [batcher.submit([i], deadline=FAR) for i in range(10)]
        with pytest.raises(Overloaded) as refused:
            batcher.submit(["one too many"], deadline=FAR)
        assert refused.value.retry_after >= 1
        assert batcher.breaker_open
        runner.gate.set()
        await asyncio.gather(*futures)
        # Drained below the close mark: admitted again.
        assert await batcher.submit(["again"], deadline=FAR) == ["again"]
        assert events.rejections == ["overloaded"]
        await finish(task)

    run_virtual(main)


def test_the_breaker_stays_open_until_the_queue_falls_to_the_close_mark() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_queue_size=10, queue_close_ratio=0.5)
        batcher.ready_instances = 1  # no collector: the queue only fills
        for i in range(10):
            batcher.submit([i], deadline=FAR)
        with pytest.raises(Overloaded):
            batcher.submit(["x"], deadline=FAR)
        batcher.line.items = 6  # as if four were served: still above the close mark
        with pytest.raises(Overloaded):
            batcher.submit(["y"], deadline=FAR)
        batcher.line.items = 5
        batcher.submit(["z"], deadline=FAR)
        assert not batcher.breaker_open

    run_virtual(main)


def test_a_request_that_cannot_be_served_before_its_deadline_is_refused_at_admission() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=4)
        batcher.throughput.per_instance = 100.0  # items per second
        for i in range(50):
            batcher.submit([i], deadline=FAR)
        # 50 items ahead at 100 items/s is 0.5 s; admission wants twice that before the
        # deadline, so 0.8 s is refused and 1.1 s admitted.
        with pytest.raises(Overloaded, match="before its deadline"):
            batcher.submit(["hurry"], deadline=0.8)
        batcher.submit(["patient"], deadline=1.1)
        assert events.rejections == ["would_miss_deadline"]

    run_virtual(main)


def test_refusals_before_ready_when_draining_and_for_too_many_items() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_items_per_request=3)
        with pytest.raises(PayloadTooLarge):
            batcher.submit([1, 2, 3, 4], deadline=FAR)
        batcher.ready_instances = 0
        with pytest.raises(NotReady):
            batcher.submit([1], deadline=FAR)
        batcher.ready_instances = 1
        batcher.drain()
        with pytest.raises(NotReady, match="shutting down"):
            batcher.submit([1], deadline=FAR)

    run_virtual(main)


def test_two_instances_run_two_batches_at_the_same_time() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(instances=2, max_batch_size=2)
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        tasks = [serve(batcher, runner), serve(batcher, runner)]
        futures = [batcher.submit([i], deadline=FAR) for i in range(4)]
        await asyncio.gather(*futures)
        assert [when for when, _ in runner.batches] == [0.0, 0.0]
        assert runner.sizes == [2, 2]
        for task in tasks:
            await finish(task)

    run_virtual(main)


def test_a_lost_instance_fails_its_in_flight_requests_promptly() -> None:
    async def main() -> None:
        batcher, _ = make_batcher()

        async def dying(inputs: list[Any]) -> tuple[Sequence[Any], float]:
            raise InstanceLost("segfault")

        task = asyncio.get_running_loop().create_task(batcher.serve(dying))
        with pytest.raises(NotReady, match="stopped"):
            await batcher.submit(["a"], deadline=FAR)
        with pytest.raises(InstanceLost):
            await task

    run_virtual(main)


def test_with_a_token_cap_queued_items_are_grouped_by_length() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=4, max_batch_tokens=1000)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = batcher.submit(["busy"], deadline=FAR, tokens=[5])
        await runner.started.wait()
        futures = []
        for index in range(4):
            futures.append(batcher.submit([f"S{index}"], deadline=FAR, tokens=[10]))
            futures.append(batcher.submit([f"L{index}"], deadline=FAR, tokens=[200]))
        results = await asyncio.gather(*futures)
        await blocker
        assert [r[0] for r in results] == [f"{k}{i}" for i in range(4) for k in "SL"]
        assert [inputs for _, inputs in runner.batches] == [
            ["busy"],
            ["S0", "S1", "S2", "S3"],
            ["L0", "L1", "L2", "L3"],
        ]
        await finish(task)

    run_virtual(main)


def test_without_a_token_cap_batches_keep_arrival_order() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=4)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        futures = []
        for index in range(2):
            futures.append(batcher.submit([f"S{index}"], deadline=FAR, tokens=[10]))
            futures.append(batcher.submit([f"L{index}"], deadline=FAR, tokens=[200]))
        await asyncio.gather(blocker, *futures)
        assert runner.batches[1][1] == ["S0", "L0", "S1", "L1"]
        await finish(task)

    run_virtual(main)


def test_a_stopped_collector_returns_the_jobs_it_was_gathering() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_queue_delay=50 * MS)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        futures = [batcher.submit([f"j{i}"], deadline=FAR) for i in range(3)]
        first = serve(batcher, runner)
        await at(10 * MS)  # inside the 50 ms window: the batch is still forming
        await finish(first)
        assert runner.batches == [] and batcher.queued_items == 3
        second = serve(batcher, runner)
        assert await asyncio.gather(*futures) == [["j0"], ["j1"], ["j2"]]
        assert runner.batches == [(50 * MS, ["j0", "j1", "j2"])]
        await finish(second)

    run_virtual(main)


def test_lengths_far_apart_are_not_mixed_even_when_the_batch_has_room() -> None:
    async def main() -> None:
        batcher, _ = make_batcher(max_batch_size=8, max_batch_tokens=10_000)
        runner = ScriptedRunner(cost=lambda n: 1 * MS)
        task = serve(batcher, runner)
        blocker = batcher.submit(["busy"], deadline=FAR, tokens=[5])
        await runner.started.wait()
        futures = [
            batcher.submit(["S0"], deadline=FAR, tokens=[16]),
            batcher.submit(["L0"], deadline=FAR, tokens=[256]),
            batcher.submit(["M0"], deadline=FAR, tokens=[30]),
            batcher.submit(["L1"], deadline=FAR, tokens=[200]),
        ]
        await asyncio.gather(blocker, *futures)
        # Room for 8, but 256- and 200-token texts would pad the short ones 10x.
        assert [inputs for _, inputs in runner.batches] == [["busy"], ["S0", "M0"], ["L0", "L1"]]
        await finish(task)

    run_virtual(main)


# --- request_done: each request's queue, compute and whole time, reported once --------------


def test_request_done_times_queue_compute_and_total_per_request() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=8, max_queue_delay=0.0)
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)  # runs 0 .. 10 ms
        await at(4 * MS)
        waiting = batcher.submit(["w"], deadline=FAR)  # waits 4 .. 10 ms, runs 10 .. 20 ms
        await asyncio.gather(blocker, waiting)
        assert events.requests == [
            pytest.approx((0.0, 10 * MS, 10 * MS, True)),
            pytest.approx((6 * MS, 10 * MS, 16 * MS, True)),
        ]
        await finish(task)

    run_virtual(main)


def test_a_split_request_is_reported_once_with_the_compute_of_all_its_batches() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=8)
        runner = ScriptedRunner(cost=lambda n: n * MS)
        task = serve(batcher, runner)
        assert len(await batcher.submit(list(range(20)), deadline=FAR)) == 20
        assert runner.sizes == [8, 8, 4]
        # Queued until its first batch (at once), computed in all three: 8 + 8 + 4 ms.
        assert events.requests == [pytest.approx((0.0, 20 * MS, 20 * MS, True))]
        await finish(task)

    run_virtual(main)


def test_failed_cancelled_and_expired_requests_are_reported_once_as_not_ok() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=2, max_queue_delay=0.0)
        batcher.throughput.per_instance = 1e6  # admission expects them in time
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        task = serve(batcher, runner)
        blocker = await occupy(batcher, runner)
        gone = batcher.submit(["g1", "g2", "g3"], deadline=FAR)
        late = batcher.submit(["late"], deadline=5 * MS)
        await at(1 * MS)
        gone.cancel()
        with pytest.raises(DeadlineExceeded):
            await late
        await blocker
        outcomes = sorted(ok for *_, ok in events.requests)
        assert outcomes == [False, False, True]
        assert events.drops == [("cancelled", 3), ("deadline", 1)]
        # Neither ran: all their time was queue time.
        for queue_s, compute_s, total_s, ok in events.requests:
            if not ok:
                assert compute_s == 0.0
                assert queue_s == pytest.approx(total_s)
        await finish(task)

    run_virtual(main)


def test_a_poisoned_request_is_reported_as_failed_and_the_rest_as_ok() -> None:
    async def main() -> None:
        batcher, events = make_batcher(max_batch_size=4, max_queue_delay=1 * MS)

        async def fragile(inputs: list[Any]) -> tuple[Sequence[Any], float]:
            if "poison" in inputs:
                raise ValueError("bad input")
            return list(inputs), 1 * MS

        task = asyncio.get_running_loop().create_task(batcher.serve(fragile))
        good = batcher.submit(["a"], deadline=FAR)
        bad = batcher.submit(["poison"], deadline=FAR)
        assert await good == ["a"]
        with pytest.raises(InferenceFailed):
            await bad
        assert sorted(ok for *_, ok in events.requests) == [False, True]
        await finish(task)

    run_virtual(main)


# ------------------------------------------------------------------ traced requests (opaque)


class TracedRecorder(Recorder):
    """Also records what the batcher reports of traced requests."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_runs: list[BatchRun] = []
        self.request_runs: list[tuple[object, RequestRun]] = []

    def batch_ran(self, batch: BatchRun) -> None:
        self.batch_runs.append(batch)

    def request_ran(self, trace: object, run: RequestRun) -> None:
        self.request_runs.append((trace, run))


def test_each_batch_reports_the_traces_of_the_requests_it_carried_and_each_request_its_times() -> (
    None
):
    async def main() -> None:
        config = BatchingConfig(max_batch_size=2, max_queue_delay=5 * MS)
        events = TracedRecorder()
        clock = asyncio.get_running_loop().time
        batcher = Batcher("m", config, FixedPolicy(config.max_queue_delay), events, clock=clock)
        batcher.instances = batcher.ready_instances = 1
        runner = ScriptedRunner(cost=lambda n: 10 * MS)
        task = asyncio.get_running_loop().create_task(batcher.serve(runner.run, "m-0"))
        busy = batcher.submit(["busy"], deadline=FAR)  # untraced: reports no batch_ran
        await runner.started.wait()
        split, small = object(), object()
        first = batcher.submit(["a", "b", "c"], deadline=FAR, trace=split)  # split over 2
        second = batcher.submit(["d"], deadline=FAR, trace=small)
        await asyncio.gather(busy, first, second)
        assert runner.batches == [(0.0, ["busy"]), (10 * MS, ["a", "b"]), (20 * MS, ["d", "c"])]
        assert [list(run.traces) for run in events.batch_runs] == [[split], [small, split]]
        assert [(run.items, run.instance, run.reason) for run in events.batch_runs] == [
            (2, "m-0", "full"),
            (2, "m-0", "full"),
        ]
        assert events.batch_runs[0].run_s == pytest.approx(10 * MS)
        runs = dict(events.request_runs)
        assert runs[split].batches == 2 and runs[small].batches == 1
        assert runs[split].queue_s == pytest.approx(10 * MS)  # queued behind "busy"
        assert runs[split].batched_s == pytest.approx(20 * MS)  # its two batches
        assert runs[split].compute_s == pytest.approx(20 * MS)
        assert runs[small].queue_s == pytest.approx(20 * MS) and runs[small].ok
        assert len(events.request_runs) == 2  # the untraced request reports none
        await finish(task)

    run_virtual(main)
