"""A queued request's wait for its outputs (:mod:`batching.plane.queueing`): the answer, the
deadline or the client's departure, whichever comes first; a watcher for the departure starts
only once the answer is late (:data:`~batching.plane.queueing.WATCH_AFTER`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from batching.core.jobs import Pending
from batching.errors import ClientGone, DeadlineExceeded
from batching.metrics import Metrics
from batching.plane.calls import Call, Caller, Deadline
from batching.plane.queueing import WATCH_AFTER, _outputs

pytestmark = pytest.mark.anyio


class Departure:
    """A client's disconnect, as a door hands it over: counts the watchers started, and
    returns once :attr:`gone` is set."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.watchers = 0

    async def __call__(self) -> None:
        self.watchers += 1
        await self.gone.wait()


def call_with(departure: Departure | None, seconds: float, metrics: Metrics) -> Call:
    loop = asyncio.get_running_loop()
    deadline = Deadline(loop.time() + seconds, seconds, True)
    caller = Caller("r-1", seconds, departure)
    deployment: Any = SimpleNamespace(name="m")
    return Call(deployment, caller, deadline, metrics)


async def test_an_answer_before_the_watch_starts_never_starts_a_watcher() -> None:
    departure = Departure()
    future = Pending()
    asyncio.get_running_loop().call_soon(future.set_result, ["out"])
    outputs = await _outputs(call_with(departure, 30.0, Metrics()), future)
    assert outputs == ["out"]
    assert departure.watchers == 0


async def test_a_client_gone_while_its_request_waits_is_told_and_its_items_dropped() -> None:
    departure = Departure()
    departure.gone.set()  # it hung up at once: noticed once the watcher starts
    future = Pending()
    started = asyncio.get_running_loop().time()
    with pytest.raises(ClientGone, match="went away"):
        await _outputs(call_with(departure, 30.0, Metrics()), future)
    assert departure.watchers == 1
    assert future.cancelled()  # the batcher drops its items wherever they are
    assert asyncio.get_running_loop().time() - started < 30.0


async def test_a_late_answer_still_comes_back_with_the_watcher_running() -> None:
    departure = Departure()
    future = Pending()
    loop = asyncio.get_running_loop()
    loop.call_later(2 * WATCH_AFTER, future.set_result, ["late"])
    assert await _outputs(call_with(departure, 30.0, Metrics()), future) == ["late"]
    assert departure.watchers == 1


async def test_the_deadline_passing_in_the_queue_is_a_counted_504_and_drops_the_items() -> None:
    metrics = Metrics()
    future = Pending()
    with pytest.raises(DeadlineExceeded, match="while it was queued"):
        await _outputs(call_with(Departure(), WATCH_AFTER / 2, metrics), future)
    assert future.cancelled()
    assert metrics.rejected.labels("m", "deadline")._value.get() == 1


class Awaited(Pending):
    """A request's future that says when its door started waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.awaited = asyncio.Event()

    def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
        super().add_done_callback(fn, context=context)
        self.awaited.set()


async def test_a_cancelled_door_cancels_the_queued_request() -> None:
    future = Awaited()
    waiting = asyncio.ensure_future(_outputs(call_with(Departure(), 30.0, Metrics()), future))
    await future.awaited.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert future.cancelled()
