""":class:`~batching.runtime.process_host.ProcessHost` over real pipes, with the test in the
child's place: what it sends for each command, how it posts a run's steps, when it asks the
child to stop, and what a child that dies does to the command in flight."""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import pytest

from batching.core.jobs import InstanceLost
from batching.errors import PayloadTooLarge
from batching.models.generation.pieces import Joining, Piece, Status
from batching.models.generation.prefix_cache import PrefixStats
from batching.models.parameters import TaskItem
from batching.runtime.process import read_frame, write_frame
from batching.runtime.process_host import ProcessHost

pytestmark = pytest.mark.anyio


@dataclass
class Watched:
    deadline: float
    status: Status = Status.RUNNING


class Child:
    """The child's ends of the two pipes."""

    def __init__(self, commands: IO[bytes], replies: IO[bytes]) -> None:
        self.commands = commands
        self.replies = replies

    def read(self) -> Any:
        return pickle.loads(read_frame(self.commands))

    async def next_command(self) -> Any:
        return await asyncio.to_thread(self.read)

    def send(self, kind: str, payload: Any) -> None:
        write_frame(self.replies, pickle.dumps((kind, payload)))


@pytest.fixture
def pair() -> Iterator[tuple[ProcessHost, Child]]:
    commands_read, commands_write = os.pipe()
    replies_read, replies_write = os.pipe()
    commands = os.fdopen(commands_write, "wb")
    replies = os.fdopen(replies_read, "rb")
    host = ProcessHost(commands, replies, lambda when: f"the child is gone {when}", "m")
    child = Child(os.fdopen(commands_read, "rb", buffering=0), os.fdopen(replies_write, "wb"))
    yield host, child
    child.replies.close()  # the host's reader sees the pipe close, and ends
    host._reader.join()
    for stream in (commands, replies, child.commands):
        stream.close()


async def test_open_and_join_answer_by_value_with_the_prefix_counts(
    pair: tuple[ProcessHost, Child],
) -> None:
    host, child = pair
    opening = asyncio.ensure_future(host.open())
    assert await child.next_command() == ("open",)
    child.send("done", (64, PrefixStats(hits=2)))
    tracked, positions = await opening
    assert positions == 64
    assert tracked.prefixes.stats() == PrefixStats(hits=2)  # type: ignore[attr-defined]

    items = [Joining(1, TaskItem("a", ())), Joining(2, TaskItem("b", ()))]
    joining = asyncio.ensure_future(host.join({7}, items))
    assert await child.next_command() == ("join", {7}, items)
    refused = PayloadTooLarge("too long")
    child.send("done", ([Piece(1, 5, "x"), refused], PrefixStats(hits=3)))
    first, second = await joining
    assert first == Piece(1, 5, "x")
    assert isinstance(second, PayloadTooLarge) and str(second) == "too long"
    assert tracked.prefixes.stats().hits == 3  # type: ignore[attr-defined]


async def test_a_run_posts_each_step_and_stops_the_child_once_a_newcomer_waits(
    pair: tuple[ProcessHost, Child],
) -> None:
    host, child = pair
    loop = asyncio.get_running_loop()
    streams = [(1, Watched(loop.time() + 30)), (2, Watched(loop.time() + 5))]
    posted: list[tuple[list[Piece], float]] = []
    waiting = threading.Event()
    second_posted = asyncio.Event()

    def post(pieces: list[Piece], seconds: float) -> None:  # on the reader thread
        posted.append((pieces, seconds))
        if len(posted) == 2:
            loop.call_soon_threadsafe(second_posted.set)

    running = asyncio.ensure_future(host.run({9}, streams, waiting.is_set, loop.time, post))
    kind, leaving, left = await child.next_command()
    assert (kind, leaving, [key for key, _ in left]) == ("run", {9}, [1, 2])
    assert 29 < left[0][1] <= 30 and 4 < left[1][1] <= 5  # seconds left, not a clock's time
    child.send("step", ([Piece(1, 3, "a"), Piece(2, 4, "b")], 0.01))
    waiting.set()  # a newcomer arrives while the second step runs
    child.send("step", ([Piece(1, 5, "c"), Piece(2, 6, "d", Status.FINISHED_LENGTH)], 0.02))
    await second_posted.wait()
    assert await child.next_command() == ("stop",)
    child.send("done", (None, None))
    assert await running is None
    assert [[p.text for p in pieces] for pieces, _ in posted] == [["a", "b"], ["c", "d"]]


async def test_a_cancelled_stream_stops_the_run_but_one_that_finished_does_not(
    pair: tuple[ProcessHost, Child],
) -> None:
    host, child = pair
    loop = asyncio.get_running_loop()
    one, two = Watched(loop.time() + 30), Watched(loop.time() + 30)
    stepped = asyncio.Event()

    def post(pieces: list[Piece], seconds: float) -> None:
        for piece in pieces:  # as the loop does: a stream's last piece finishes it
            if piece.finish is not None:
                (one if piece.key == 1 else two).status = piece.finish
        loop.call_soon_threadsafe(stepped.set)

    running = asyncio.ensure_future(host.run(set(), [(1, one), (2, two)], bool, loop.time, post))
    await child.next_command()
    child.send("step", ([Piece(1, 3, "a", Status.FINISHED_STOP), Piece(2, 4, "b")], 0.01))
    await stepped.wait()
    stepped.clear()
    two.status = Status.FINISHED_CANCELLED  # the client of stream 2 went away
    child.send("step", ([Piece(2, 5, "c")], 0.01))
    await stepped.wait()
    assert await child.next_command() == ("stop",)  # sent once, for the cancel only
    child.send("done", (None, None))
    assert await running is None


async def test_a_child_that_dies_fails_the_command_in_flight_and_every_later_one(
    pair: tuple[ProcessHost, Child],
) -> None:
    host, child = pair
    loop = asyncio.get_running_loop()
    running = asyncio.ensure_future(
        host.run(set(), [(1, Watched(loop.time() + 30))], bool, loop.time, lambda *_: None)
    )
    await child.next_command()
    child.replies.close()  # the child's end of the pipe closes: it died
    with pytest.raises(InstanceLost, match="the child is gone while generating"):
        await running
    with pytest.raises(InstanceLost):
        await host.join(set(), [])


async def test_a_failed_step_comes_back_as_the_runs_answer(
    pair: tuple[ProcessHost, Child],
) -> None:
    host, child = pair
    loop = asyncio.get_running_loop()
    running = asyncio.ensure_future(host.run(set(), [], bool, loop.time, lambda *_: None))
    await child.next_command()
    child.send("done", (RuntimeError("ValueError: the model failed"), None))
    failed = await running
    assert isinstance(failed, RuntimeError) and "the model failed" in str(failed)
    joining = asyncio.ensure_future(host.join(set(), []))
    await child.next_command()
    child.send("error", ValueError("the batch is broken"))
    with pytest.raises(ValueError, match="the batch is broken"):
        await joining


def test_a_batch_handed_to_a_generating_process_fails_its_requests_not_the_instance() -> None:
    """Generation goes through the decode loop; were a whole batch ever handed to the
    instance, its requests fail (500) and the instance is not lost (no restart)."""
    from batching.errors import InferenceFailed
    from batching.runtime.process_host import GeneratingProcess

    instance = GeneratingProcess(object, "cpu", "writer")
    try:
        with pytest.raises(InferenceFailed):  # not InstanceLost, which restarts the instance
            asyncio.run(instance.run([TaskItem("the cat", ())]))
    finally:
        instance.close()
