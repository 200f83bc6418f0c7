"""The one thread of an instance (:class:`batching.runtime.worker.InstanceThread`): an executor
of one daemon thread, whose calls run in order, and which never keeps the process alive."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from batching.runtime.worker import InstanceThread

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.anyio
async def test_calls_run_in_order_on_one_daemon_thread_named_for_the_instance() -> None:
    worker = InstanceThread("m-0")
    seen: list[tuple[int, str, bool]] = []

    def record(number: int) -> int:
        thread = threading.current_thread()
        seen.append((number, thread.name, thread.daemon))
        return number * 2

    loop = asyncio.get_running_loop()
    results = await asyncio.gather(*(loop.run_in_executor(worker, record, n) for n in range(5)))
    worker.shutdown()
    assert results == [0, 2, 4, 6, 8]
    assert seen == [(n, "m-0", True) for n in range(5)]


def test_an_exception_goes_to_its_caller_and_the_thread_serves_on() -> None:
    worker = InstanceThread("m-0")

    def fail(exc: BaseException) -> None:
        raise exc

    with pytest.raises(ValueError, match="bad batch"):
        worker.submit(fail, ValueError("bad batch")).result(10)
    with pytest.raises(SystemExit):
        worker.submit(fail, SystemExit("the instance died")).result(10)
    assert worker.submit(sum, [1, 2]).result(10) == 3
    worker.shutdown()


def test_shutdown_can_cancel_what_is_queued_and_takes_no_more_calls() -> None:
    worker = InstanceThread("m-0")
    gate = threading.Event()
    running = worker.submit(gate.wait, 10)
    queued = worker.submit(sum, [1])
    worker.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        worker.submit(sum, [1])
    gate.set()
    assert running.result(10) is True


def test_the_initializer_runs_first_on_the_thread() -> None:
    ran: list[str] = []
    worker = InstanceThread("m-0", initializer=lambda: ran.append(threading.current_thread().name))
    assert worker.submit(lambda: list(ran)).result(10) == ["m-0"]
    worker.shutdown()


def test_a_call_that_never_returns_does_not_keep_the_process_alive() -> None:
    program = (
        "import threading\n"
        "from batching.runtime.worker import InstanceThread\n"
        "worker = InstanceThread('stuck')\n"
        "started = threading.Event()\n"
        "worker.submit(lambda: (started.set(), threading.Event().wait()))\n"
        "assert started.wait(10)\n"
        "print('leaving', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "leaving\n"


@pytest.mark.anyio
async def test_call_soon_answers_on_the_loop_in_turn_with_its_result_or_its_exception() -> None:
    worker = InstanceThread("m-0")
    seen: list[tuple[int, str]] = []

    def record(number: int) -> int:
        seen.append((number, threading.current_thread().name))
        if number == 3:
            raise ValueError("bad batch")
        return number * 2

    futures = [worker.call_soon(record, n) for n in range(5)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    worker.shutdown()
    assert results[:3] == [0, 2, 4] and results[4] == 8
    assert isinstance(results[3], ValueError) and str(results[3]) == "bad batch"
    assert seen == [(n, "m-0") for n in range(5)]


@pytest.mark.anyio
async def test_a_call_cancelled_before_its_turn_never_runs() -> None:
    worker = InstanceThread("m-0")
    gate = threading.Event()
    ran: list[str] = []
    running = worker.call_soon(gate.wait, 10)
    skipped = worker.call_soon(ran.append, "skipped")
    skipped.cancel()
    gate.set()
    assert await running is True
    assert await worker.call_soon(ran.append, "after") is None
    worker.shutdown()
    assert ran == ["after"]


@pytest.mark.anyio
async def test_shutdown_cancels_the_calls_still_waiting_for_their_turn() -> None:
    worker = InstanceThread("m-0")
    gate = threading.Event()
    running = worker.call_soon(gate.wait, 10)
    queued = worker.call_soon(sum, [1])
    worker.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(asyncio.CancelledError):
        await queued
    with pytest.raises(RuntimeError, match="after shutdown"):
        worker.call_soon(sum, [1])
    gate.set()
    assert await running is True


def test_shutdown_runs_its_last_call_on_the_thread_after_the_call_running() -> None:
    worker = InstanceThread("m-0")
    gate = threading.Event()
    order: list[str] = []

    def running() -> None:
        gate.wait(10)
        order.append("batch")

    first = worker.submit(running)
    queued = worker.submit(order.append, "queued")
    done = threading.Event()

    def last() -> None:
        order.append(f"last on {threading.current_thread().name}")
        done.set()

    worker.shutdown(wait=False, cancel_futures=True, last=last)
    assert order == []  # not before the batch ends
    gate.set()
    first.result(10)
    assert done.wait(10)
    assert queued.cancelled()
    assert order == ["batch", "last on m-0"]
    worker.shutdown(last=lambda: order.append("twice"))  # a second shutdown runs nothing
    assert order == ["batch", "last on m-0"]


def test_a_worker_that_never_started_runs_its_last_call_at_once() -> None:
    worker = InstanceThread("m-0")
    ran: list[str] = []
    worker.shutdown(wait=False, last=lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]
