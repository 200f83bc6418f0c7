"""The requests that still hold a deployment: what a swap or an unload waits for.

A door resolves a model's deployment once per request and keeps using it (its metadata, its
batcher) until it answers. When the deployment is replaced (a reload) or removed (an unload),
the requests that resolved it before must still be served by it: it stops only once every
request that holds it has answered. Each request runs in its own asyncio task (uvicorn's
request cycle, a gRPC call), so a lease is the task: taken when the request resolves the
deployment, given back when it is recorded, or at the latest when its task ends.
"""

from __future__ import annotations

import asyncio

__all__ = ["Leases"]


class Leases:
    """The tasks that hold one deployment."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self._released: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def take(self) -> None:
        """The running task holds the deployment until :meth:`give_back` or its end; nothing
        outside a task (or outside a running loop) is tracked."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if task is None or task in self._tasks:
            return
        self._tasks.add(task)
        task.add_done_callback(self._end)

    def give_back(self) -> None:
        """The running task is done with the deployment."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if task is not None and task in self._tasks:
            task.remove_done_callback(self._end)
            self._end(task)

    def _end(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if self._released is not None:
            self._released.set()

    async def wait(self) -> None:
        """Wait until no task but the running one holds the deployment (bound it with
        :func:`asyncio.timeout`)."""
        me = asyncio.current_task()
        while self._tasks - {me}:
            self._released = released = asyncio.Event()
            await released.wait()
