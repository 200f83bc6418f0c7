"""Iteration-level decoding: the running batch of a tiny GPT-2 (greedy tokens independent of
company: alone, in a burst of 16, joining a running batch), and the scheduler's admission,
departures, deadlines and per-sequence faults over a scripted batch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batching.core.events import NoEvents
from batching.errors import (
    DeadlineExceeded,
    InferenceFailed,
    Overloaded,
    PayloadTooLarge,
    UnprocessableInput,
)
from batching.models.generation import causal_batch
from batching.models.generation.causal import TextGenerator
from batching.models.generation.pieces import Joining, Piece, Status
from batching.models.parameters import TaskItem
from batching.runtime.batch_host import ThreadHost
from batching.runtime.scheduler import StepScheduler
from tests.support.generators import causal_reference, direct, gpt2_folder
from tests.support.running_batches import (
    check_company_free,
    check_seeded_sampling,
    check_stop_string,
    item,
    run,
)

PROMPTS = [
    "the cat sat",
    "a dog",
    "who eats fish on the mat",
    "i like green",
    "sat",
    "the cat runs fast on the mat",
    "green fish",
    "who",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpt2_folder(tmp_path_factory.mktemp("decoding"))


@pytest.fixture(scope="module")
def generator(folder: Path) -> TextGenerator:
    model = TextGenerator("text-generation", folder)
    model.load("cpu")
    return model


def test_greedy_tokens_are_the_same_alone_in_a_burst_and_joining(
    folder: Path, generator: TextGenerator
) -> None:
    reference = causal_reference(folder)
    lengths = [20, 3, 12, 25, 7, 16, 9, 22]
    items = [item(PROMPTS[i % 8], lengths[i % 8] - i // 8) for i in range(16)]
    ids = [generator._prepare(0, entry).ids for entry in items]
    expected = [
        direct(reference, ids[i], max_new_tokens=lengths[i % 8] - i // 8) for i in range(16)
    ]
    check_company_free(generator.decode_batch, items, expected)


def test_newcomers_prefilled_together_get_the_tokens_they_get_alone(
    folder: Path, generator: TextGenerator
) -> None:
    reference = causal_reference(folder)
    lengths = [20, 3, 12, 25, 7, 16, 9, 22]
    items = [item(PROMPTS[i % 8], lengths[i % 8] - i // 8) for i in range(16)]
    expected = [
        direct(reference, generator._prepare(0, entry).ids, max_new_tokens=lengths[i % 8] - i // 8)
        for i, entry in enumerate(items)
    ]
    # A burst of 16 in one padded prefill.
    burst = run(generator.decode_batch(), {0: list(enumerate(items))}, together=True)
    assert [burst[i] for i in range(16)] == expected
    # Groups joining a running batch whose cache is shorter or longer than theirs, while rows
    # leave (the cache's buffers grow on either side and rows move into freed places).
    joins: dict[int, list[tuple[int, TaskItem]]] = {}
    for index, entry in enumerate(items):
        joins.setdefault((index * 7) % 11, []).append((index, entry))
    joined = run(generator.decode_batch(), joins, together=True)
    assert [joined[i] for i in range(16)] == expected


def test_a_newcomer_that_fails_fails_alone_in_a_shared_prefill(generator: TextGenerator) -> None:
    batch = generator.decode_batch()
    too_long = TaskItem(" ".join(PROMPTS * 4), (("max_new_tokens", 4), ("truncate", False)))
    outcomes = batch.join_items(
        [
            Joining(0, item(PROMPTS[0], 4)),
            Joining(1, too_long),
            Joining(2, 42),
            Joining(3, item(PROMPTS[1], 4)),
        ]
    )
    assert not isinstance(outcomes[0], BaseException) and outcomes[0].key == 0
    assert isinstance(outcomes[1], PayloadTooLarge)
    assert isinstance(outcomes[2], UnprocessableInput)
    assert not isinstance(outcomes[3], BaseException) and outcomes[3].key == 3
    assert len(batch) == 2


def test_a_shared_prefill_that_raises_joins_each_newcomer_alone(
    generator: TextGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = generator.decode_batch()
    together = batch.join_many

    def refuse_groups(prompts: Any) -> Any:
        if len(prompts) > 1:
            raise RuntimeError("the shared prefill broke")
        return together(prompts)

    monkeypatch.setattr(batch, "join_many", refuse_groups)
    outcomes = batch.join_items([Joining(0, item(PROMPTS[0], 4)), Joining(1, item(PROMPTS[1], 4))])
    assert [getattr(outcome, "key", outcome) for outcome in outcomes] == [0, 1]
    assert len(batch) == 2


def test_rows_that_leave_free_their_cache(generator: TextGenerator) -> None:
    batch = generator.decode_batch()
    batch.join_item(0, item(PROMPTS[5], 20))
    batch.join_item(1, item(PROMPTS[4], 20))
    batch.step()
    wide = batch.columns
    batch.leave({0})
    assert len(batch) == 1
    assert batch.columns < wide  # the long prompt's padding columns are gone
    batch.leave({1})
    assert len(batch) == 0 and batch.columns == 0 and batch.window.count == 0


def test_an_idle_batch_keeps_only_small_buffers_and_reuses_them(
    generator: TextGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next lone request writes into the buffers the last one left (no allocation on its
    way to a first token) and gets the tokens a fresh batch gives; over
    IDLE_BUFFER_BYTES, an idle batch gives its buffers back."""
    fresh = generator.decode_batch()
    alone = fresh.complete([fresh._prepared(Joining(0, item(PROMPTS[2], 6)))])
    batch = generator.decode_batch()
    batch.join_item(0, item(PROMPTS[5], 5))
    while batch.rows:
        batch.leave({piece.key for piece in batch.step() if piece.finish})
    kept = batch.window.keys[0]
    assert batch.cache is not None
    again = batch.complete([batch._prepared(Joining(1, item(PROMPTS[2], 6)))])
    assert batch.window.keys[0] is kept
    assert again == alone
    monkeypatch.setattr(causal_batch, "IDLE_BUFFER_BYTES", 0)
    batch.join_item(2, item(PROMPTS[5], 3))
    while batch.rows:
        batch.leave({piece.key for piece in batch.step() if piece.finish})
    assert batch.cache is None and batch.window.keys == []


def test_the_cache_buffers_shrink_when_most_rows_left(generator: TextGenerator) -> None:
    batch = generator.decode_batch()
    batch.join_items([Joining(key, item(PROMPTS[key % 8], 20)) for key in range(16)])
    batch.step()
    assert batch.window.rows_capacity >= 16
    batch.leave(set(range(14)))
    assert len(batch) == 2 and batch.window.count == 2
    assert batch.window.rows_capacity < 16
    assert {row.key for row in batch.rows} == {14, 15}
    pieces = batch.step()  # the rows that moved still decode
    assert [piece.key for piece in pieces] == [row.key for row in batch.rows]


def test_seeded_sampling_is_the_same_alone_and_in_company(generator: TextGenerator) -> None:
    check_seeded_sampling(generator.decode_batch, PROMPTS)


def test_a_stop_string_ends_the_sequence_and_is_not_sent(generator: TextGenerator) -> None:
    check_stop_string(generator.decode_batch, PROMPTS[0], 2)


# -- the scheduler over a scripted batch ------------------------------------------------------


LENGTH = Status.FINISHED_LENGTH


class Scripted:
    """A running batch whose item ``(n, fail)`` yields n tokens; ``fail`` "join" raises at
    its join, "step" makes the next step raise."""

    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = {}
        self.fail_step = False
        self.joined: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def join_item(self, key: int, entry: Any) -> Piece:
        count, fail = entry
        if fail == "join":
            raise ValueError("cannot read this input")
        if fail == "step":
            self.fail_step = True
        self.joined.append(key)
        self.rows[key] = [count, 1]
        return Piece(key, 0, "a", LENGTH if count == 1 else None, 1)

    def join_items(self, items: list[Joining]) -> list[Piece | BaseException]:
        outcomes: list[Piece | BaseException] = []
        for key, entry, _ in items:
            try:
                outcomes.append(self.join_item(key, entry))
            except ValueError as exc:
                outcomes.append(exc)
        return outcomes

    def step(self) -> list[Piece]:
        if self.fail_step:
            self.fail_step = False
            raise RuntimeError("the model broke")
        pieces = []
        for key, row in self.rows.items():
            row[1] += 1
            pieces.append(Piece(key, row[1], "b", LENGTH if row[1] >= row[0] else None, 1))
        return pieces

    def leave(self, keys: set[int]) -> None:
        for key in keys:
            self.rows.pop(key, None)


class Model:
    def __init__(self, batch: Scripted) -> None:
        self.batch = batch

    def decode_batch(self) -> Scripted:
        return self.batch

    def positions(self) -> int:
        return 32


async def started(
    decoder: StepScheduler, batch: Scripted, instances: int = 1
) -> asyncio.Task[None]:
    model = Model(batch)
    loaded = asyncio.Event()

    async def call(function: Callable[[Any], Any]) -> Any:
        await asyncio.sleep(0)
        try:
            return function(model)
        finally:
            loaded.set()

    task = asyncio.create_task(decoder.serve(ThreadHost(call)))
    await loaded.wait()  # serve counted the instance before it waited again
    assert decoder.instances == instances
    return task


async def drain(stream: Any) -> str:
    text = ""
    while (piece := await stream.next()) is not None:
        text += piece.text
    return text


def test_admission_counts_tokens_and_frees_them_at_the_end() -> None:
    asyncio.run(_admission_counts_tokens_and_frees_them_at_the_end())


async def _admission_counts_tokens_and_frees_them_at_the_end() -> None:
    decoder = StepScheduler("m", max_rows=4, budget=100)
    task = await started(decoder, Scripted())
    deadline = asyncio.get_running_loop().time() + 30
    first = decoder.submit((3, None), 60, deadline)
    with pytest.raises(Overloaded) as refused:
        decoder.submit((3, None), 41, deadline)
    assert refused.value.retry_after >= 1
    with pytest.raises(PayloadTooLarge):
        decoder.submit((3, None), 101, deadline)
    second = decoder.submit((2, None), 40, deadline)
    assert await drain(first) == "abb"
    assert await drain(second) == "ab"
    assert decoder.reserved == 0
    decoder.submit((1, None), 100, deadline)  # the whole budget is free again
    task.cancel()


def test_more_rows_than_the_cap_wait_their_turn() -> None:
    asyncio.run(_more_rows_than_the_cap_wait_their_turn())


async def _more_rows_than_the_cap_wait_their_turn() -> None:
    decoder = StepScheduler("m", max_rows=2, budget=1000)
    batch = Scripted()
    task = await started(decoder, batch)
    deadline = asyncio.get_running_loop().time() + 30
    streams = [decoder.submit((4, None), 10, deadline) for _ in range(3)]
    assert [await drain(stream) for stream in streams] == ["abbb"] * 3
    assert batch.joined == [streams[0].key, streams[1].key, streams[2].key]
    task.cancel()


def test_newcomers_are_spread_over_the_instances_batches() -> None:
    asyncio.run(_newcomers_are_spread_over_the_instances_batches())


async def _newcomers_are_spread_over_the_instances_batches() -> None:
    decoder = StepScheduler("m", max_rows=4, budget=1000)
    batches = [Scripted(), Scripted()]
    tasks = [
        await started(decoder, batch, instances=index + 1) for index, batch in enumerate(batches)
    ]
    deadline = asyncio.get_running_loop().time() + 30
    streams = [decoder.submit((3, None), 10, deadline) for _ in range(4)]
    assert [await drain(stream) for stream in streams] == ["abb"] * 4
    # Each took its share (two of the four arriving together), not the first to step all four.
    assert sorted(len(batch.joined) for batch in batches) == [2, 2]
    # Alone, an instance takes up to the cap.
    for task in tasks[1:]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert decoder.instances == 1
    joined = [len(batch.joined) for batch in batches]
    streams = [decoder.submit((3, None), 10, deadline) for _ in range(4)]
    assert [await drain(stream) for stream in streams] == ["abb"] * 4
    assert len(batches[0].joined) == joined[0] + 4
    tasks[0].cancel()


def test_a_cancelled_stream_leaves_at_the_next_step() -> None:
    asyncio.run(_a_cancelled_stream_leaves_at_the_next_step())


async def _a_cancelled_stream_leaves_at_the_next_step() -> None:
    decoder = StepScheduler("m", max_rows=4, budget=1000)
    batch = Scripted()
    task = await started(decoder, batch)
    deadline = asyncio.get_running_loop().time() + 30
    gone = decoder.submit((1000, None), 10, deadline)
    assert (await gone.next()) is not None
    gone.cancel()
    assert gone.status is Status.FINISHED_CANCELLED
    assert decoder.reserved == 10  # held until its row leaves, at the next step
    other = decoder.submit((3, None), 10, deadline)
    assert await drain(other) == "abb"
    assert gone.key not in batch.rows
    assert await gone.next() is None
    assert decoder.reserved == 0
    task.cancel()


def test_the_deadline_ends_a_sequence_that_runs_past_it() -> None:
    asyncio.run(_the_deadline_ends_a_sequence_that_runs_past_it())


async def _the_deadline_ends_a_sequence_that_runs_past_it() -> None:
    now = [0.0]
    decoder = StepScheduler("m", max_rows=4, budget=1000, clock=lambda: now[0])
    batch = Scripted()
    task = await started(decoder, batch)
    long = decoder.submit((1000, None), 10, asyncio.get_running_loop().time() + 30)
    assert (await long.next()) is not None
    now[0] = 31.0 + asyncio.get_running_loop().time()  # the scheduler's clock passes it
    with pytest.raises(DeadlineExceeded):
        while await long.next() is not None:
            pass
    assert long.status is Status.FINISHED_ERROR
    assert decoder.reserved == 0
    task.cancel()


def test_a_stream_waiting_past_its_deadline_fails_and_an_ended_one_keeps_no_timer() -> None:
    asyncio.run(_a_stream_waiting_past_its_deadline_fails_and_an_ended_one_keeps_no_timer())


async def _a_stream_waiting_past_its_deadline_fails_and_an_ended_one_keeps_no_timer() -> None:
    # One row, taken by a long stream: the next one waits in the queue, where no step looks
    # at it, and its deadline alone ends it.
    decoder = StepScheduler("m", max_rows=1, budget=10000)
    task = await started(decoder, Scripted())
    loop = asyncio.get_running_loop()
    far = loop.time() + 3600
    long = decoder.submit((10**9, None), 10, far)  # ends only when cancelled, below
    assert (await long.next()) is not None
    waiting = decoder.submit((3, None), 10, loop.time() + 0.01)
    with pytest.raises(DeadlineExceeded):
        await waiting.next()
    assert waiting.status is Status.FINISHED_ERROR and waiting._timer is None
    long.cancel()
    # Streams that end (by their length, or cancelled) cancel their deadline's timer at once,
    # also when the deadline is far away: nothing of them stays on the event loop.
    done = decoder.submit((3, None), 10, far)
    assert await drain(done) == "abb"
    gone = decoder.submit((1000, None), 10, far)
    assert (await gone.next()) is not None
    await gone.next()  # waits: the deadline's timer is set
    assert gone._timer is not None
    gone.cancel()
    assert done._timer is None and gone._timer is None
    task.cancel()


def test_a_fault_fails_its_own_sequence_only() -> None:
    asyncio.run(_a_fault_fails_its_own_sequence_only())


async def _a_fault_fails_its_own_sequence_only() -> None:
    decoder = StepScheduler("m", max_rows=4, budget=1000)
    task = await started(decoder, Scripted())
    deadline = asyncio.get_running_loop().time() + 30
    bad = decoder.submit((3, "join"), 10, deadline)
    good = decoder.submit((3, None), 10, deadline)
    with pytest.raises(InferenceFailed):
        await bad.next()
    assert await drain(good) == "abb"
    # A step that raises fails the sequences it ran; the loop serves the next ones.
    broken = decoder.submit((3, "step"), 10, deadline)
    assert (await broken.next()) is not None
    with pytest.raises(InferenceFailed):
        await broken.next()
    after = decoder.submit((2, None), 10, deadline)
    assert await drain(after) == "ab"
    assert decoder.reserved == 0
    task.cancel()


class Together(Scripted):
    """A scripted batch that logs its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[int]]] = []

    def join_items(self, items: list[Joining]) -> list[Piece | BaseException]:
        self.calls.append(("join", [joining.key for joining in items]))
        return super().join_items(items)

    def step(self) -> list[Piece]:
        self.calls.append(("step", sorted(self.rows)))
        return super().step()


def test_newcomers_join_together_before_the_running_rows_step() -> None:
    asyncio.run(_newcomers_join_together_before_the_running_rows_step())


async def _newcomers_join_together_before_the_running_rows_step() -> None:
    decoder = StepScheduler("m", max_rows=4, budget=1000)
    batch = Together()
    task = await started(decoder, batch)
    deadline = asyncio.get_running_loop().time() + 30
    first = decoder.submit((1000, None), 10, deadline)
    assert (await first.next()) is not None
    second = decoder.submit((3, None), 10, deadline)
    bad = decoder.submit((3, "join"), 10, deadline)
    third = decoder.submit((2, None), 10, deadline)
    assert await drain(third) == "ab"
    with pytest.raises(InferenceFailed):
        await bad.next()
    assert await drain(second) == "abb"
    joins = [keys for kind, keys in batch.calls if kind == "join"]
    assert joins == [[first.key], [second.key, bad.key, third.key]]
    # The newcomers' prefill came before the first step that runs them.
    at = batch.calls.index(("join", [second.key, bad.key, third.key]))
    assert batch.calls[at + 1] == ("step", sorted([first.key, second.key, third.key]))
    first.cancel()
    task.cancel()


def test_a_forward_runs_on_the_governors_threads_and_leaves_the_count_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from batching.models.engines.governor import ThreadGovernor
    from batching.models.generation.running import Threads

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("BATCHING_ADAPTIVE_THREADS", "1")
    threads = Threads()
    assert not threads.fixed
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []
        one = ThreadGovernor((1,))
        out = threads.run(one, 4, 4, lambda: seen.append(torch.get_num_threads()) or "out")
        assert out == "out" and seen == [1]
        assert torch.get_num_threads() == 2
        learnt = one.describe()["<=7"]  # the forward's time on one thread, for 4 rows
        assert isinstance(learnt, dict) and "1" in learnt["us_per_token"]
    finally:
        torch.set_num_threads(before)


def test_prefills_are_compared_by_their_tokens_and_steps_by_their_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-row prefill of 10 tokens and one of 200 are judged apart: their costs per token
    differ by their length, not by the threads they ran on."""
    from batching.models.generation.running import Threads

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("BATCHING_ADAPTIVE_THREADS", "1")
    threads = Threads()
    threads.run(threads.prefills, 1, 10, lambda: None)
    threads.run(threads.prefills, 1, 200, lambda: None)
    threads.run(threads.steps, 16, 16, lambda: None)
    assert set(threads.prefills.describe()) == {"<=15", "<=255"}
    assert set(threads.steps.describe()) == {"<=31"}


class PrefillBreaks(Together):
    """A batch whose next prefill raises as a whole: a fault of the batch, not of an item
    (the running batch itself tries a failed shared prefill one by one)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    def join_items(self, items: list[Joining]) -> list[Piece | BaseException]:
        if self.broken:
            self.broken = False
            raise RuntimeError("the prefill broke")
        return super().join_items(items)


def test_a_prefill_that_raises_fails_its_newcomers_and_the_loop_goes_on() -> None:
    asyncio.run(_a_prefill_that_raises_fails_its_newcomers_and_the_loop_goes_on())


async def _a_prefill_that_raises_fails_its_newcomers_and_the_loop_goes_on() -> None:
    decoder = StepScheduler("m", max_rows=4, budget=1000)
    batch = PrefillBreaks()
    task = await started(decoder, batch)
    deadline = asyncio.get_running_loop().time() + 30
    first = decoder.submit((3, None), 10, deadline)
    second = decoder.submit((3, None), 10, deadline)
    for failed in (first, second):
        with pytest.raises(InferenceFailed):
            await failed.next()
        assert failed.status is Status.FINISHED_ERROR
    after = decoder.submit((2, None), 10, deadline)
    assert await drain(after) == "ab"
    assert after.status is Status.FINISHED_LENGTH
    assert batch.joined == [after.key]
    assert decoder.reserved == 0
    task.cancel()


class Recorded(NoEvents):
    """The events a scheduler tells, as the batcher's observer hears them."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, str]] = []
        self.requests: list[bool] = []
        self.steps: list[int] = []

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None:
        self.batches.append((items, reason))

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        self.requests.append(ok)

    def step_done(self, rows: int, seconds: float) -> None:
        assert seconds >= 0
        self.steps.append(rows)


def test_each_decode_step_is_told_with_the_rows_that_got_a_token() -> None:
    asyncio.run(_each_decode_step_is_told_with_the_rows_that_got_a_token())


async def _each_decode_step_is_told_with_the_rows_that_got_a_token() -> None:
    events = Recorded()
    decoder = StepScheduler("m", max_rows=4, budget=1000, events=events)
    task = await started(decoder, Scripted())
    deadline = asyncio.get_running_loop().time() + 30
    short, long = decoder.submit((3, None), 10, deadline), decoder.submit((5, None), 10, deadline)
    assert [await drain(short), await drain(long)] == ["abb", "abbbb"]
    # Their first tokens came from the prefill (no step); then two steps of both, and the
    # long one's last two alone.
    assert events.steps == [2, 2, 1, 1]
    task.cancel()


def test_each_prefill_is_told_as_a_batch_and_each_stream_once_as_it_ends() -> None:
    asyncio.run(_each_prefill_is_told_as_a_batch_and_each_stream_once_as_it_ends())


async def _each_prefill_is_told_as_a_batch_and_each_stream_once_as_it_ends() -> None:
    events = Recorded()
    decoder = StepScheduler("m", max_rows=4, budget=1000, events=events)
    task = await started(decoder, Scripted())
    deadline = asyncio.get_running_loop().time() + 30
    first, second = (decoder.submit((3, None), 10, deadline) for _ in range(2))
    assert [await drain(first), await drain(second)] == ["abb", "abb"]
    bad = decoder.submit((3, "join"), 10, deadline)
    with pytest.raises(InferenceFailed):
        await bad.next()
    gone = decoder.submit((1000, None), 10, deadline)
    assert await gone.next() is not None
    gone.cancel()
    last = decoder.submit((2, None), 10, deadline)
    assert await drain(last) == "ab"
    # The two that joined together were one batch of two; a failed join is no batch.
    assert events.batches == [(2, "prefill"), (1, "prefill"), (1, "prefill")]
    assert sorted(events.requests) == [False, False, True, True, True]
    task.cancel()
