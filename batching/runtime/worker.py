"""The one thread an instance does its blocking work on: a daemon thread, as an executor.

``concurrent.futures.ThreadPoolExecutor`` would do the same job, but its threads are not
daemons, and the interpreter joins every one of them at exit: a model whose ``load`` never
returns (a hung download, a lock, a runaway loop) then keeps the process alive after the
server has shut down, SIGTERM or not. An instance's thread holds nothing that must outlive the
server (a process instance's child is killed by its ``close``), so it is a daemon: the process
ends when the server is done, whatever the model is doing.

The event loop hands it a call with :meth:`InstanceThread.call_soon`: the call's answer comes
back as an asyncio future, settled by one ``call_soon_threadsafe`` from the thread. That is
half of what ``loop.run_in_executor`` costs on every batch (a ``concurrent.futures.Future``
with its condition variable, and the chained callbacks that copy its state across), which with
a model that answers at once was a tenth of the event loop's time per request (profiled).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["InstanceThread"]

T = TypeVar("T")
V = TypeVar("V")
P = ParamSpec("P")

#: A call waiting for the thread: what cancels its future, and what runs it (and resolves it).
_Call = tuple[Callable[[], bool], Callable[[], None]]


class InstanceThread(concurrent.futures.Executor):
    """An executor of one daemon thread, started at the first call: calls run one at a time,
    in the order they were submitted (``loop.run_in_executor`` takes it as any executor).

    :param name: the thread's name (the instance's).
    :param initializer: run first on the thread (to lower its CPU priority, say).
    """

    def __init__(self, name: str, initializer: Callable[[], None] | None = None) -> None:
        self._name = name
        self._initializer = initializer
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shut = False

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        if kwargs:
            raise TypeError("InstanceThread.submit takes positional arguments only")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: B036 - the caller's future carries it
                future.set_exception(exc)
            else:
                future.set_result(result)

        self._enqueue(future.cancel, run)
        return future

    def call_soon(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> asyncio.Future[T]:
        """``fn(*args)`` on the thread, in turn; its result (or exception) as a future of the
        running event loop. Cancelling the future before its turn comes skips the call (a
        call already running runs to its end, its answer dropped).

        Call it on the event loop's thread."""
        if kwargs:
            raise TypeError("InstanceThread.call_soon takes positional arguments only")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def run() -> None:
            if future.cancelled():  # read across threads: at worst a call nobody waits for
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: B036 - the caller's future carries it
                _answer(loop, _fail, future, exc)
            else:
                _answer(loop, _settle, future, result)

        def cancel() -> bool:
            _answer(loop, _cancel, future, None)
            return True

        self._enqueue(cancel, run)
        return future

    def _enqueue(self, cancel: Callable[[], bool], run: Callable[[], None]) -> None:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._calls.put((cancel, run))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()

    def shutdown(
        self,
        wait: bool = True,
        *,
        cancel_futures: bool = False,
        last: Callable[[], None] | None = None,
    ) -> None:
        """No call is taken from now on; the ones queued run first, unless
        ``cancel_futures``. ``wait``: until the thread is done (never from the thread).
        ``last``: run on the thread after every call that runs (at once, here, if the thread
        never started; its exceptions are the caller's to catch)."""
        with self._lock:
            if not self._shut:
                self._shut = True
                if cancel_futures:
                    self._cancel_queued()
                if last is not None and self._thread is not None:
                    self._calls.put((_never_cancelled, last))
                    last = None
                self._calls.put(None)
            else:
                last = None
            thread = self._thread
        if last is not None:
            last()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _cancel_queued(self) -> None:
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return
            if call is not None:
                call[0]()

    def _work(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while True:
            call = self._calls.get()
            if call is None:
                return
            call[1]()
            del call  # no reference outlives the call


def _never_cancelled() -> bool:
    return False


def _answer(
    loop: asyncio.AbstractEventLoop,
    how: Callable[[asyncio.Future[T], V], None],
    future: asyncio.Future[T],
    value: V,
) -> None:
    """Settle ``future`` on its loop, from any thread; a loop already closed hears nothing."""
    try:
        loop.call_soon_threadsafe(how, future, value)
    except RuntimeError:  # the loop is closed: nobody is left to answer
        pass


def _settle(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[T], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _cancel(future: asyncio.Future[T], _: object) -> None:
    future.cancel()
