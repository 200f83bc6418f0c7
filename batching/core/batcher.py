"""Dynamic batching: one asyncio queue per model, one collector per model instance.

Handlers call :meth:`Batcher.submit` on the event loop: it admits the request (or refuses it
at once), puts one :class:`Job` on the model's ``asyncio.Queue`` and returns a future. Each
instance has a collector coroutine on the loop: while its instance is free it forms the next
batch, then hands the batch to the instance's own thread or process and resolves every
caller's future with exactly its own outputs. Only the event loop ever touches the queue and
the futures, so nothing here needs a lock shared with another thread.

This module knows nothing of HTTP, torch or Prometheus: instances are callables that run a
batch, and everything worth counting goes to a :class:`BatchEvents` observer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from batching.errors import (
    ClientError,
    DeadlineExceeded,
    InferenceFailed,
    NotReady,
    PayloadTooLarge,
)

from .admission import Admission, Throughput
from .config import BatchingConfig
from .events import BatchEvents, BatchRun, NoEvents, RequestRun
from .jobs import InstanceLost, Job, Pending, Request, RunBatch
from .packing import LENGTH_SPREAD, Batch, inputs_of, longest, padded_tokens
from .policy import BatchPolicy, Formation

__all__ = ["BatchEvents", "Batcher", "InstanceLost", "Job", "Pending", "Request", "RunBatch"]

logger = logging.getLogger("batching")


class Batcher:
    """One model's queue and the collectors that batch it onto the model's instances.

    :param name: the model's name, for logs.
    :param config: batching and admission settings.
    :param policy: decides the wait window of each forming batch.
    :param events: receives counts and timings.
    :param clock: seconds, for the per-request times of ``request_done`` only.
    :param rng: draws the spread of Retry-After hints (tests inject a seeded one).

    Fair queuing: small requests are served first come, first served; a request larger than
    what the next batch can take is split, and the unserved rest goes to the *back* of the
    queue, behind everything that arrived until the next batch starts forming. A request
    larger than the batch cap therefore takes one batch-sized turn per round, and a request
    queued behind it waits for at most the turn already running, not for all of it.

    Time is the running loop's clock; tests drive it with a virtual-time loop. The times each
    request reports are read from ``clock`` instead (``time.perf_counter`` by default): under
    uvloop the loop's clock ticks in whole milliseconds, too coarse for sub-millisecond queue
    and compute times.
    """

    def __init__(
        self,
        name: str,
        config: BatchingConfig,
        policy: BatchPolicy,
        events: BatchEvents | None = None,
        clock: Callable[[], float] = time.perf_counter,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.config = config
        self.policy = policy
        self.events: BatchEvents = events or NoEvents()
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        # Jobs taken but not served (a batch that could not take them, a stopped collector)
        # go back to the head of the line, in order. The unserved rest of a split request
        # instead waits in the rotation, and joins the back of the queue when the next batch
        # starts forming, behind what arrived while its turn ran (see :meth:`_rotate`).
        self._head: collections.deque[Job] = collections.deque()
        self._rotation: collections.deque[Job] = collections.deque()
        self._arrival_waiters: list[asyncio.Future[None]] = []
        self._formation = asyncio.Lock()
        self.queued_items = 0
        #: Admitted requests none of whose items has started running yet.
        self.queued_requests = 0
        self.busy_instances = 0
        #: Items in batches running on instances now.
        self.running_items = 0
        #: When each batch running now started (loop time).
        self._batch_starts: list[float] = []
        self.instances = 0
        self.ready_instances = 0
        self.admission = Admission(name, config, self.events, rng=rng)
        self.draining = False
        self._preferred = frozenset(config.preferred_batch_sizes)

    # ----------------------------------------------------------------------- loop side: admit

    def admit(self, count: int, *, deadline: float) -> float:
        """Refuse a request of ``count`` items now if :meth:`submit` would, without queueing
        anything: a door asks before work it would waste on a refused request (counting its
        tokens). Returns the loop's time of the decision when it is admitted.

        :raises PayloadTooLarge: more items than one request may carry.
        :raises NotReady: no instance is ready, or the server is draining.
        :raises Overloaded: the queue is full, or cannot be served before ``deadline``.
        """
        if count > self.config.max_items_per_request:
            self.events.rejected("too_large")
            raise PayloadTooLarge(
                f"a request may carry at most {self.config.max_items_per_request} items, "
                f"this one has {count}"
            )
        if self.draining:
            self.events.rejected("not_ready")
            raise NotReady("the server is shutting down", retry_after=1.0)
        if self.ready_instances == 0:
            self.events.rejected("not_ready")
            raise NotReady(f"model {self.name!r} is not ready", retry_after=1.0)
        now = asyncio.get_running_loop().time()
        self.admission.check(
            count,
            queued=self.queued_items,
            running=self.running_items,
            instances=self.ready_instances,
            time_left=deadline - now,
            now=now,
            busy_since=(
                min(self._batch_starts)
                if self._batch_starts and self.busy_instances >= self.ready_instances
                else None
            ),
        )
        return now

    def submit(
        self,
        items: list[Any],
        *,
        deadline: float,
        tokens: list[int] | None = None,
        request_id: str = "",
        token_cap: int | None = None,
        trace: object | None = None,
    ) -> Pending:
        """Admit ``items`` as one request and return the future of their outputs, in order.

        ``tokens`` are the items' token counts; ``token_cap`` (with them) caps the padded
        tokens of every batch the items run in, below the model's own token cap if it has one.
        ``trace`` is the caller's trace context, opaque here: the events hand it back with
        each batch that carried the request's items and when it is resolved.

        :raises PayloadTooLarge: more items than one request may carry.
        :raises NotReady: no instance is ready, or the server is draining.
        :raises Overloaded: the queue is full, or cannot be served before ``deadline``.
        """
        count = len(items)
        now = self.admit(count, deadline=deadline)
        loop = asyncio.get_running_loop()
        future = Pending(loop=loop)
        request = Request(
            items=items,
            tokens=tokens,
            future=future,
            enqueued_at=now,
            deadline=deadline,
            request_id=request_id,
            results=[None] * count,
            unresolved=count,
            admitted=self.clock(),
            token_cap=token_cap,
            trace=trace,
        )
        self.queue.put_nowait(Job(request, 0, count))
        self.queued_items += count
        self.queued_requests += 1
        self.policy.observe_arrival(now, count)
        self._wake_collectors()
        return future

    @property
    def throughput(self) -> Throughput:
        """The measured items per second of one instance."""
        return self.admission.throughput

    @property
    def breaker_open(self) -> bool:
        return self.admission.breaker_open

    def drain(self) -> None:
        """Refuse new requests from now on; what is queued is still served."""
        self.draining = True

    @property
    def idle(self) -> bool:
        return self.queued_items == 0 and self.busy_instances == 0

    # --------------------------------------------------------------- loop side: form batches

    def _wake_collectors(self) -> None:
        waiters, self._arrival_waiters = self._arrival_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait_for_arrival(self, within: float) -> None:
        # Not asyncio.wait_for(queue.get()): on 3.11 it can lose an item that arrives just as
        # the timeout fires. Waiting for a signal and then taking with get_nowait cannot.
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._arrival_waiters.append(waiter)
        timer = loop.call_later(within, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    def _take_nowait(self) -> Job | None:
        """The next live job, or None; drops jobs whose caller is gone or too late."""
        while True:
            if self._head:
                job = self._head.popleft()
            elif not self.queue.empty():
                job = self.queue.get_nowait()
            elif self._rotation:
                job = self._rotation.popleft()
            else:
                return None
            self.queued_items -= job.size
            if self._is_live(job):
                return job

    def _is_live(self, job: Job) -> bool:
        request = job.request
        if request.future.done():
            # Cancelled by a disconnect or a deadline, or failed with another part of it.
            self.events.dropped("cancelled", job.size)
            self._report(request)
            return False
        if request.deadline <= asyncio.get_running_loop().time():
            self.events.dropped("deadline", job.size)
            request.fail(DeadlineExceeded("the request's deadline passed while it was queued"))
            self._report(request)
            return False
        return True

    def _report(self, request: Request) -> None:
        """Tell the observer how a resolved request went; once per request."""
        if request.reported:
            return
        request.reported = True
        if request.started is None:
            self.queued_requests -= 1  # resolved (dropped, failed) before it ever ran
        now = self.clock()
        started = now if request.started is None else request.started
        self.events.request_done(
            started - request.admitted,
            request.compute_s,
            now - request.admitted,
            request.unresolved == 0,
        )
        if request.trace is not None:
            run = RequestRun(
                queue_s=started - request.admitted,
                batched_s=now - started,
                compute_s=request.compute_s,
                batches=request.batches,
                ok=request.unresolved == 0,
            )
            self.events.request_ran(request.trace, run)

    async def _take(self) -> Job:
        while True:
            job = self._take_nowait()
            if job is not None:
                return job
            await self._wait_nonempty()

    async def _wait_nonempty(self) -> None:
        if not self._head and self.queue.empty() and not self._rotation:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._arrival_waiters.append(waiter)
            await waiter

    async def next_batch(self) -> tuple[list[Job], str, bool]:
        """Wait for work and form the next batch; returns its jobs, why it was released, and
        whether work was already waiting when this collector's turn to form came (the
        instance went from one batch to the next without waiting for an arrival).

        Reasons: ``full`` (item or token cap), ``preferred_size``, ``deadline`` (the window
        from the oldest job's enqueue time ran out), ``instance_free`` (nothing else queued:
        no reason to wait).
        """
        async with self._formation:
            # The rest of a split request takes its next turn behind what has arrived.
            while self._rotation:
                self.queue.put_nowait(self._rotation.popleft())
            waiting = self.queued_items > 0
            first = await self._take()
            batch = Batch(self.config.max_batch_size, self.config.max_batch_tokens)
            self._return(first, batch.take(first))
            try:
                reason = await self._collect(batch, first)
            except asyncio.CancelledError:
                # The instance is stopping: what it had gathered goes back, in order, for
                # another instance (or the shutdown) to deal with.
                for job in reversed(batch.jobs):
                    self._put_back(job)
                raise
            return batch.jobs, reason, waiting

    async def _collect(self, batch: Batch, first: Job) -> str:
        loop = asyncio.get_running_loop()
        config = self.config
        group_by_length = config.max_batch_tokens is not None and first.request.tokens is not None
        backlog = bool(self._head) or not self.queue.empty() or bool(self._rotation)
        oldest = first.request.enqueued_at
        while True:
            if group_by_length:
                closed = self._fill_by_length(batch, longest(first))
            else:
                closed = self._fill_in_order(batch)
            if closed:
                return "full"
            if batch.items in self._preferred:
                return "preferred_size"
            delay = self.policy.max_delay(
                Formation(
                    now=loop.time(),
                    oldest_enqueued_at=oldest,
                    batch_items=batch.items,
                    batch_tokens=batch.tokens,
                    max_batch_size=config.max_batch_size,
                    backlog=backlog,
                    busy_instances=self.busy_instances,
                    instances=self.instances,
                )
            )
            remaining = oldest + min(delay, config.max_queue_delay) - loop.time()
            if remaining <= 0:
                return "deadline" if backlog else "instance_free"
            await self._wait_for_arrival(remaining)

    def _fill_in_order(self, batch: Batch) -> bool:
        """Add queued jobs first come, first served; True when the batch can take no more."""
        while not batch.full:
            job = self._take_nowait()
            if job is None:
                return False
            rest = batch.take(job)
            if rest is not None:
                self._return(job, rest)
                return True
        return True

    def _fill_by_length(self, batch: Batch, length: int) -> bool:
        """Add the queued jobs closest in length to the batch's oldest, so short texts do not
        pay for a long one's padding. The oldest job is always in the batch, so a long job
        waits at most until it is the oldest. True when the batch can take no more."""
        pool: list[Job] = []
        pooled = 0
        # Looking further than a few batches ahead buys little and costs a sort per batch.
        while pooled < 4 * batch.max_items:
            job = self._take_nowait()
            if job is None:
                break
            pool.append(job)
            pooled += job.size
        left: dict[int, Job] = dict(enumerate(pool))
        split: set[int] = set()
        for index in sorted(left, key=lambda i: abs(longest(pool[i]) - length)):
            if batch.full:
                break
            other = longest(pool[index])
            if max(other, length) > LENGTH_SPREAD * max(1, min(other, length)):
                # A short text in a long batch costs the long one's padding: it waits for a
                # batch of its own length (at the latest, the one it is the oldest of).
                continue
            rest = batch.take(pool[index])
            if rest is None:
                del left[index]
            else:
                if rest is not pool[index]:
                    split.add(index)
                left[index] = rest
        for index in sorted(left, reverse=True):
            if index not in split:
                self._put_back(left[index])
        for index in sorted(split):
            self._rotate(left[index])
        return batch.full or bool(left)

    def _return(self, taken: Job, rest: Job | None) -> None:
        """What a batch left of ``taken``: nothing, all of it (it keeps its place at the head
        of the line), or the rest of a split (it goes round to the back)."""
        if rest is None:
            return
        if rest is taken:
            self._put_back(rest)
        else:
            self._rotate(rest)

    def _put_back(self, job: Job | None) -> None:
        if job is not None:
            self._head.appendleft(job)
            self.queued_items += job.size

    def _rotate(self, job: Job) -> None:
        """The unserved rest of a request that was just served a batch-sized turn goes round
        to the back of the queue once the next batch starts forming: round-robin by request,
        so a 1,024-item request cannot hold the line while small requests queued behind it
        wait for all of it, and it still gets a turn per round however many arrive."""
        self._rotation.append(job)
        self.queued_items += job.size

    # ----------------------------------------------------------- loop side: run and resolve

    async def serve(self, run: RunBatch, instance: str = "") -> None:
        """The collector of one instance: form a batch, run it, resolve it; forever.
        ``instance`` names the instance in the :class:`BatchRun` events."""
        loop = asyncio.get_running_loop()
        # When this instance's previous batch ended: if work was waiting for it from then on,
        # the span to this batch's end is one busy cycle, whose items per wall second
        # admission learns.
        previous_end: float | None = None
        while True:
            jobs, reason, waiting = await self.next_batch()
            backlogged_since = previous_end if waiting else None
            jobs = [job for job in jobs if self._is_live(job)]
            if not jobs:
                continue
            started = loop.time()
            queue_wait = started - min(job.request.enqueued_at for job in jobs)
            started_by_clock = self.clock()
            for job in jobs:
                if job.request.started is None:
                    job.request.started = started_by_clock
                    job.request.future.running = True
                    self.queued_requests -= 1
            self.busy_instances += 1
            self._batch_starts.append(started)
            running = sum(job.size for job in jobs)
            self.running_items += running
            try:
                # Only batches that show what a busy instance does teach the capacity
                # estimate: a batch of a few items at low load (or while a retry storm keeps
                # most requests out) understates it, and learning from it would refuse more.
                learn = reason == "full" or 2 * running >= self.config.max_batch_size
                items, tokens, compute_s = await self._run_isolating_errors(run, jobs, learn)
            except (InstanceLost, asyncio.CancelledError):
                # The instance is gone (or the server stops): these callers must hear now,
                # not at their deadline.
                lost = NotReady("the model instance serving this request stopped; retry")
                for job in jobs:
                    job.request.fail(lost)
                    self._report(job.request)
                raise
            finally:
                self.busy_instances -= 1
                self._batch_starts.remove(started)
                self.running_items -= running
            self.events.batch_done(items, tokens, reason, queue_wait, compute_s)
            traces = _traces_of(jobs)
            if traces:
                run_s = self.clock() - started_by_clock
                batch = BatchRun(
                    items, tokens, reason, instance, queue_wait, run_s, compute_s, traces
                )
                self.events.batch_ran(batch)
            ended = loop.time()
            self.throughput.observe_batch(ended - started)
            if learn and backlogged_since is not None:
                self.throughput.observe_served(items, ended - backlogged_since)
            previous_end = ended
            for job in jobs:
                # A request runs in one batch, or in consecutive ones when it was split;
                # each batch's compute counts in full for each request in it, as in Triton.
                job.request.compute_s += compute_s
                if job.request.future.done():
                    self._report(job.request)

    async def _run_isolating_errors(
        self, run: RunBatch, jobs: list[Job], learn: bool = False
    ) -> tuple[int, int, float]:
        """Run ``jobs`` as one batch; when the model raises, bisect so that only the jobs
        holding a failing input fail. Returns items, padded tokens and compute seconds.
        ``learn``: the batch is representative of a busy instance, and its rate is learnt."""
        inputs = inputs_of(jobs)
        tokens = padded_tokens(jobs)
        try:
            outputs, compute_s = await run(inputs)
        except InstanceLost:
            raise
        except Exception as exc:
            if len(jobs) == 1 and isinstance(exc, ClientError):
                # The model says this input is one it cannot take: the client's to fix.
                logger.debug(
                    "model %s refused request %s: %s",
                    self.name,
                    jobs[0].request.request_id or "-",
                    exc,
                )
                jobs[0].request.fail(exc)
                return len(inputs), tokens, 0.0
            if len(jobs) == 1:
                job = jobs[0]
                logger.error(
                    "model %s failed on request %s: %r",
                    self.name,
                    job.request.request_id or "-",
                    exc,
                    exc_info=exc,
                )
                job.request.fail(InferenceFailed("the model failed on this request's input"))
                return len(inputs), tokens, 0.0
            middle = len(jobs) // 2
            left = await self._run_isolating_errors(run, jobs[:middle])
            right = await self._run_isolating_errors(run, jobs[middle:])
            return left[0] + right[0], left[1] + right[1], left[2] + right[2]
        if len(outputs) != len(inputs):
            logger.error(
                "model %s returned %d outputs for %d inputs; failing requests %s",
                self.name,
                len(outputs),
                len(inputs),
                ",".join(job.request.request_id or "-" for job in jobs),
            )
            failure = InferenceFailed("the model returned the wrong number of outputs")
            for job in jobs:
                job.request.fail(failure)
            return len(inputs), tokens, compute_s
        if learn:
            self.throughput.observe(len(inputs), compute_s)
        self.policy.observe_batch(len(inputs), tokens, compute_s)
        offset = 0
        for job in jobs:
            job.request.settle(job.start, outputs[offset : offset + job.size])
            offset += job.size
        return len(inputs), tokens, compute_s

    def fail_all(self, exc: BaseException) -> None:
        """Fail everything still queued (shutdown with nothing left to serve it)."""
        while True:
            job = self._take_nowait()
            if job is None:
                return
            job.request.fail(exc)
            self._report(job.request)


def _traces_of(jobs: list[Job]) -> list[object]:
    """The traces of the requests ``jobs`` belong to, once each, in order; each such request
    counts one more batch."""
    traces: list[object] = []
    seen: set[int] = set()
    for job in jobs:
        request = job.request
        if request.trace is None or id(request) in seen:
            continue
        seen.add(id(request))
        request.batches += 1
        traces.append(request.trace)
    return traces


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
