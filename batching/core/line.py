"""The line of one model's queue: the jobs waiting, in the order batches take them, and the
collectors waiting for one to arrive.

A job waits in one of three places, taken in this order: the head (jobs taken but not served,
a batch that could not take them or a stopped collector: back in front, in order), the queue
(arrivals, first come, first served) and the rotation (the unserved rest of a split request,
which joins the back of the queue when the next batch starts forming, :meth:`Line.rotate`).
Only the event loop touches it, so nothing here needs a lock.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic

from .jobs import ItemT, Job

__all__ = ["Line"]


class Line(Generic[ItemT]):
    """The jobs of one model waiting for a batch, and how many items they hold."""

    def __init__(self) -> None:
        self._head: collections.deque[Job[ItemT]] = collections.deque()
        self._queue: collections.deque[Job[ItemT]] = collections.deque()
        self._rotation: collections.deque[Job[ItemT]] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []
        #: Items of the jobs waiting in any of the three places.
        self.items = 0

    @property
    def waiting(self) -> bool:
        """Whether any job waits."""
        return bool(self._head or self._queue or self._rotation)

    def arrive(self, job: Job[ItemT]) -> None:
        """A new request's job joins the back of the queue; a collector waiting wakes."""
        self._queue.append(job)
        self.items += job.size
        self._wake()

    def take(self) -> Job[ItemT] | None:
        """The next job waiting, or None."""
        for place in (self._head, self._queue, self._rotation):
            if place:
                job = place.popleft()
                self.items -= job.size
                return job
        return None

    def put_back(self, job: Job[ItemT] | None) -> None:
        """A job taken but not served goes back to the front of the line."""
        if job is not None:
            self._head.appendleft(job)
            self.items += job.size

    def rotate(self, job: Job[ItemT]) -> None:
        """The unserved rest of a request that was just served a batch-sized turn goes round
        to the back of the queue once the next batch starts forming: round-robin by request,
        so a 1,024-item request cannot hold the line while small requests queued behind it
        wait for all of it, and it still gets a turn per round however many arrive."""
        self._rotation.append(job)
        self.items += job.size

    def leave(self, taken: Job[ItemT], rest: Job[ItemT] | None) -> None:
        """What a batch left of ``taken``: nothing, all of it (it keeps its place at the head
        of the line), or the rest of a split (it goes round to the back)."""
        if rest is None:
            return
        if rest is taken:
            self.put_back(rest)
        else:
            self.rotate(rest)

    def next_turn(self) -> None:
        """A batch starts forming: the rest of a split request takes its next turn behind what
        has arrived."""
        while self._rotation:
            self._queue.append(self._rotation.popleft())

    async def wait_for_arrival(self, within: float) -> None:
        """Wait until a job arrives, or ``within`` seconds have passed."""
        # Not asyncio.wait_for(queue.get()): on 3.11 it can lose an item that arrives just as
        # the timeout fires. Waiting for a signal and then taking with take() cannot.
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(within, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    async def wait_for_a_job(self) -> None:
        """Wait until a job waits (at once, if one does)."""
        if not self.waiting:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _resolve(waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
