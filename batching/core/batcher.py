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
import random
import time
from collections.abc import Callable
from typing import Generic

from batching.errors import DeadlineExceeded, NotReady, PayloadTooLarge

from .admission import Admission, Throughput
from .batching_config import BatchingConfig
from .bisection import run_bisecting
from .events import BatchEvents, BatchRun, NoEvents, RequestRun
from .jobs import InstanceLost, ItemT, Job, Pending, RunBatch, Submission
from .line import Line
from .packing import Batch, fill_by_length, fill_in_order, longest
from .policy import BatchPolicy, Formation

__all__ = [
    "BatchEvents",
    "Batcher",
    "InstanceLost",
    "ItemT",
    "Job",
    "Pending",
    "Submission",
    "RunBatch",
]


class Batcher(Generic[ItemT]):
    """One model's queue and the collectors that batch it onto the model's instances.

    :param name: the model's name, for logs.
    :param config: batching and admission settings.
    :param policy: decides the wait window of each forming batch.
    :param events: receives counts and timings.
    :param clock: seconds, for the per-request times of ``request_done`` only.
    :param rng: draws the spread of Retry-After hints (tests inject a seeded one).

    Generic in its items (``Batcher[Item]`` in the runtime): it counts, slices and hands them
    to the instances' runners, and never looks inside one.

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
        #: The jobs waiting, in the order batches take them (fair: see :class:`Line`).
        self.line: Line[ItemT] = Line()
        self._formation = asyncio.Lock()
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
        items: list[ItemT],
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
        request: Submission[ItemT] = Submission(
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
        self.line.arrive(Job(request, 0, count))
        self.queued_requests += 1
        self.policy.observe_arrival(now, count)
        return future

    @property
    def queued_items(self) -> int:
        """Items waiting for a batch."""
        return self.line.items

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

    def _take_nowait(self) -> Job[ItemT] | None:
        """The next live job, or None; drops jobs whose caller is gone or too late."""
        while True:
            job = self.line.take()
            if job is None or self._is_live(job):
                return job

    def _is_live(self, job: Job[ItemT]) -> bool:
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

    def _report(self, request: Submission[ItemT]) -> None:
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

    async def _take(self) -> Job[ItemT]:
        while True:
            job = self._take_nowait()
            if job is not None:
                return job
            await self.line.wait_for_a_job()

    async def next_batch(self) -> tuple[list[Job[ItemT]], str, bool]:
        """Wait for work and form the next batch; returns its jobs, why it was released, and
        whether work was already waiting when this collector's turn to form came (the
        instance went from one batch to the next without waiting for an arrival).

        Reasons: ``full`` (item or token cap), ``preferred_size``, ``deadline`` (the window
        from the oldest job's enqueue time ran out), ``instance_free`` (nothing else queued:
        no reason to wait).
        """
        async with self._formation:
            self.line.next_turn()
            waiting = self.queued_items > 0
            first = await self._take()
            batch: Batch[ItemT] = Batch(self.config.max_batch_size, self.config.max_batch_tokens)
            self.line.leave(first, batch.take(first))
            try:
                reason = await self._collect(batch, first)
            except asyncio.CancelledError:
                # The instance is stopping: what it had gathered goes back, in order, for
                # another instance (or the shutdown) to deal with.
                for job in reversed(batch.jobs):
                    self.line.put_back(job)
                raise
            return batch.jobs, reason, waiting

    async def _collect(self, batch: Batch[ItemT], first: Job[ItemT]) -> str:
        loop = asyncio.get_running_loop()
        config = self.config
        group_by_length = config.max_batch_tokens is not None and first.request.tokens is not None
        backlog = self.line.waiting
        oldest = first.request.enqueued_at
        while True:
            if group_by_length:
                closed = fill_by_length(batch, longest(first), self.line, self._take_nowait)
            else:
                closed = fill_in_order(batch, self.line, self._take_nowait)
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
            await self.line.wait_for_arrival(remaining)

    # ----------------------------------------------------------- loop side: run and resolve

    async def serve(self, run: RunBatch[ItemT], instance: str = "") -> None:
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
                items, tokens, compute_s = await run_bisecting(
                    run, jobs, self.name, self._observe, learn
                )
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

    def _observe(self, items: int, tokens: int, compute_s: float, learn: bool) -> None:
        """A batch the model ran to the end; ``learn``: it shows what a busy instance does."""
        if learn:
            self.throughput.observe(items, compute_s)
        self.policy.observe_batch(items, tokens, compute_s)

    def fail_all(self, exc: BaseException) -> None:
        """Fail everything still queued (shutdown with nothing left to serve it)."""
        while True:
            job = self._take_nowait()
            if job is None:
                return
            job.request.fail(exc)
            self._report(job.request)


def _traces_of(jobs: list[Job[ItemT]]) -> list[object]:
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
