"""The one thread an instance does its blocking work on: a daemon thread, as an executor.

``concurrent.futures.ThreadPoolExecutor`` would do the same job, but its threads are not
daemons, and the interpreter joins every one of them at exit: a model whose ``load`` never
returns (a hung download, a lock, a runaway loop) then keeps the process alive after the
server has shut down, SIGTERM or not. An instance's thread holds nothing that must outlive the
server (a process instance's child is killed by its ``close``), so it is a daemon: the process
ends when the server is done, whatever the model is doing.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["InstanceThread"]

T = TypeVar("T")
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

        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._calls.put((future.cancel, run))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No call is taken from now on; the ones queued run first, unless
        ``cancel_futures``. ``wait``: until the thread is done (never from the thread)."""
        with self._lock:
            if not self._shut:
                self._shut = True
                if cancel_futures:
                    self._cancel_queued()
                self._calls.put(None)
            thread = self._thread
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
