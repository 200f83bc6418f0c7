"""Packing jobs into a batch under the item and padded-token caps: a forming batch
(:class:`Batch`), and the two ways it is filled from the line, in order or by length."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic

from .jobs import ItemT, Job
from .line import Line

__all__ = [
    "LENGTH_SPREAD",
    "Batch",
    "fill_by_length",
    "fill_in_order",
    "inputs_of",
    "longest",
    "padded_tokens",
]

#: With a token cap, a batch takes inputs at most this many times longer or shorter than its
#: oldest one: mixing lengths further apart costs more padding than a batch of its own.
LENGTH_SPREAD = 2.0


class Batch(Generic[ItemT]):
    """A forming batch: jobs whose slices add up to at most the item and token caps."""

    __slots__ = ("jobs", "items", "longest", "max_items", "max_tokens")

    def __init__(self, max_items: int, max_tokens: int | None) -> None:
        self.jobs: list[Job[ItemT]] = []
        self.items = 0
        self.longest = 0
        self.max_items = max_items
        self.max_tokens = max_tokens

    @property
    def tokens(self) -> int:
        return self.items * self.longest

    @property
    def full(self) -> bool:
        if self.items >= self.max_items:
            return True
        return self.max_tokens is not None and (self.items + 1) * self.longest >= self.max_tokens

    def take(self, job: Job[ItemT]) -> Job[ItemT] | None:
        """Add as much of ``job`` as fits; return the part that does not, if any.

        A request with a ``token_cap`` (items whose outputs grow with their tokens, such as
        per-token vectors) lowers the batch's token cap to it once any of its items joins, so
        the whole batch, whatever else it holds, stays under it."""
        room = self.max_items - self.items
        request = job.request
        tokens = request.tokens
        limit = self.max_tokens
        if tokens is not None and request.token_cap is not None:
            limit = request.token_cap if limit is None else min(limit, request.token_cap)
        if tokens is not None and limit is None:
            self.longest = max(self.longest, *tokens[job.start : job.start + min(room, job.size)])
        elif tokens is not None and limit is not None:
            longest, fits = self.longest, 0
            for index in range(job.start, job.start + min(room, job.size)):
                candidate = max(longest, tokens[index])
                # A lone item longer than the cap still runs (truncation bounds it); otherwise
                # the padded size items x longest must stay under the cap.
                if self.items + fits > 0 and (self.items + fits + 1) * candidate > limit:
                    break
                longest, fits = candidate, fits + 1
            room = fits
            self.longest = longest
            if fits:
                self.max_tokens = limit
        if room <= 0:
            return job
        if job.size <= room:
            self.jobs.append(job)
            self.items += job.size
            return None
        head = Job(job.request, job.start, job.start + room)
        self.jobs.append(head)
        self.items += room
        return Job(job.request, job.start + room, job.stop)


def fill_in_order(
    batch: Batch[ItemT], line: Line[ItemT], take: Callable[[], Job[ItemT] | None]
) -> bool:
    """Add the jobs ``take`` gives (the live ones of ``line``) first come, first served; True
    when the batch can take no more."""
    while not batch.full:
        job = take()
        if job is None:
            return False
        rest = batch.take(job)
        if rest is not None:
            line.leave(job, rest)
            return True
    return True


def fill_by_length(
    batch: Batch[ItemT],
    length: int,
    line: Line[ItemT],
    take: Callable[[], Job[ItemT] | None],
) -> bool:
    """Add the jobs closest in length to the batch's oldest (``length`` tokens), so short
    texts do not pay for a long one's padding. The oldest job is always in the batch, so a
    long job waits at most until it is the oldest. True when the batch can take no more."""
    pool: list[Job[ItemT]] = []
    pooled = 0
    # Looking further than a few batches ahead buys little and costs a sort per batch.
    while pooled < 4 * batch.max_items:
        job = take()
        if job is None:
            break
        pool.append(job)
        pooled += job.size
    left: dict[int, Job[ItemT]] = dict(enumerate(pool))
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
            line.put_back(left[index])
    for index in sorted(split):
        line.rotate(left[index])
    return batch.full or bool(left)


def inputs_of(jobs: list[Job[ItemT]]) -> list[ItemT]:
    if len(jobs) == 1 and jobs[0].size == len(jobs[0].request.items):
        return jobs[0].request.items
    out: list[ItemT] = []
    for job in jobs:
        out.extend(job.request.items[job.start : job.stop])
    return out


def longest(job: Job[ItemT]) -> int:
    tokens = job.request.tokens
    return max(tokens[job.start : job.stop]) if tokens else 0


def padded_tokens(jobs: list[Job[ItemT]]) -> int:
    longest, count = 0, 0
    for job in jobs:
        tokens = job.request.tokens
        if tokens is None:
            return 0
        count += job.size
        longest = max(longest, max(tokens[job.start : job.stop]))
    return longest * count
