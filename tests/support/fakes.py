"""Test doubles: a virtual-time event loop and in-loop runners whose timing the test scripts."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """A selector that, instead of blocking with a timeout, jumps the loop's clock to it.

    Time therefore moves only when every task is waiting for a timer: trio's autojump clock
    for asyncio. I/O that is ready is still returned at once; with no timer at all it blocks
    for real (a thread may wake the loop).
    """

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout is not None and timeout <= 0:
            return ready
        if timeout is None:
            return super().select(None)
        self.loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` starts at 0 and advances only by jumps."""

    def __init__(self) -> None:
        self.now = 0.0
        selector = _JumpingSelector()
        selector.loop = self
        super().__init__(selector)

    def time(self) -> float:
        return self.now


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


async def at(when: float) -> None:
    """Wait until loop time ``when`` (a scripted arrival, not a synchronisation)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, when - loop.time()))


class ScriptedRunner:
    """Runs batches on the loop: records when each started and with what, takes
    ``cost(n)`` seconds of virtual time, and answers ``transform(item)`` per item.

    ``gate`` (when set) holds every batch until the test opens it.
    """

    def __init__(
        self,
        cost: Callable[[int], float] = lambda n: 0.0,
        transform: Callable[[Any], Any] = lambda item: item,
    ) -> None:
        self.cost = cost
        self.transform = transform
        self.batches: list[tuple[float, list[Any]]] = []
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        loop = asyncio.get_running_loop()
        self.batches.append((round(loop.time(), 9), list(inputs)))
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        cost = self.cost(len(inputs))
        if cost:
            await asyncio.sleep(cost)
        return [self.transform(item) for item in inputs], cost

    @property
    def sizes(self) -> list[int]:
        return [len(inputs) for _, inputs in self.batches]
