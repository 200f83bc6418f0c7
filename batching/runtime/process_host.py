"""A generating model's instance in a process of its own: its running batch lives, prefills and
steps in the child, and the server's process only schedules and writes the streams.

Why a process: on a thread instance the decode steps share the interpreter with the event
loop. A step of a small model is mostly short operators and the Python of the model's modules
between them; every time an operator lets go of the interpreter's lock, the event loop (which
writes a chunk to each of 16 streams per step) may take it, and the step waits. Measured on
two cores with 16 streams, a served step took 10-12 ms against 8.4 ms alone
(``docs/generation.md``). In a child the steps hold a lock of their own, the event loop keeps
the other core, and only the pieces cross (a pickled list per step), as vLLM's engine core
runs beside its API server.

The conversation, frames on the child's stdin and stdout (:mod:`.process`), one command at a
time from the scheduler:

- ``("open",)`` -> the model's positions and its prefix cache's counts;
- ``("join", leaving, items)`` -> each newcomer's first piece or what failed it
  (:func:`~.batch_host.join_turn`);
- ``("run", leaving, [(key, seconds left)])`` -> one ``("step", pieces, seconds)`` frame per
  decode step, then ``("ran", failure)``. The parent reads each step's pieces on a thread of
  its own, hands them to the event loop, and sends ``("stop",)`` as soon as the scheduler has
  something to decide (a newcomer waits, a stream was cancelled); the child reads it between
  two steps. Deadlines travel as seconds left, so the two processes need not share a clock.

A child that dies fails the command in flight with :class:`InstanceLost` and the streams it
ran; the deployment starts a new instance.
"""

from __future__ import annotations

import asyncio
import pickle
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from batching.core.jobs import InstanceLost, Outputs
from batching.errors import InferenceFailed
from batching.models.generation.pieces import Joining, Piece, Status
from batching.models.generation.prefix_cache import KeepsPrefixes, PrefixStats
from batching.models.items import Item

from .batch_host import Post, RunningBatch, join_turn, open_batch
from .process import ProcessInstance, child_setup, read_frame, reply, reply_error, write_frame
from .step_run import StepRun, Watched
from .warmup import InstanceInfo

__all__ = ["DIRECT_WRITE_BYTES", "GeneratingProcess", "ProcessHost"]

#: Commands smaller than this are written from the event loop: a pipe holds 64 KiB, and the
#: child has read every earlier command (the scheduler sends one at a time, ``stop`` aside).
DIRECT_WRITE_BYTES = 16 * 1024


class GeneratingProcess(ProcessInstance):
    """A generating model's instance in its own process (``instance_kind: process``): the
    decode loop reaches it through :meth:`batch_host`."""

    boot = "from batching.runtime.process_host import _engine_main; _engine_main()"

    _host: ProcessHost | None = None

    async def start(self, max_batch_size: int) -> InstanceInfo:
        info = await super().start(max_batch_size)
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        self._host = ProcessHost(process.stdin, process.stdout, self._exit_message, self.name)
        return info

    def batch_host(self) -> ProcessHost:
        if self._host is None:
            raise InstanceLost("the instance process has not started")
        return self._host

    async def run(self, inputs: list[Item]) -> tuple[Outputs, float]:
        # No door hands a generating model's items to the batcher (they go through the
        # decode loop); should one, its requests fail and the instance, which is well, stays.
        raise InferenceFailed("a generating model answers through its decode loop only")


class _Prefixes:
    """The child's prefix cache as the model's metrics see it: the counts it sent last."""

    def __init__(self) -> None:
        self.last = PrefixStats()
        #: Whether the child's batch keeps prefixes at all.
        self.kept = False

    def stats(self) -> PrefixStats:
        return self.last


class _Tracked:
    """What the model's prefix metrics track of a batch in a child (a
    :class:`~batching.models.generation.prefix_cache.KeepsPrefixes`)."""

    def __init__(self, prefixes: _Prefixes | None) -> None:
        self.prefixes: Any = prefixes


@dataclass(slots=True)
class _Run:
    """The run of steps in flight: where its pieces go and when to stop it."""

    stepping: Sequence[tuple[int, Watched]]
    waiting: Callable[[], bool]
    post: Post
    gone: set[int]
    stopped: bool = False


class ProcessHost:
    """The running batch of a :class:`GeneratingProcess`'s child, driven over its pipes.

    Commands are written under a lock (the reader thread writes ``stop``); replies and steps
    are read by one daemon thread, which settles the command's future on the event loop and
    posts each step's pieces as the child sends them.
    """

    def __init__(
        self,
        commands: IO[bytes],
        replies: IO[bytes],
        exit_message: Callable[[str], str],
        name: str,
    ) -> None:
        self._commands = commands
        self._replies = replies
        self._exit_message = exit_message
        self._name = name
        self._write_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Future[Any] | None = None
        self._run: _Run | None = None
        self._lost: InstanceLost | None = None
        self._prefixes = _Prefixes()
        self._reader = threading.Thread(target=self._read, name=f"{name}-replies", daemon=True)
        self._reader.start()

    # -- the scheduler's side ------------------------------------------------------------

    async def open(self) -> tuple[object, int]:
        positions = await self._command(("open",))
        return _Tracked(self._prefixes if self._prefixes.kept else None), int(positions)

    async def join(
        self, leaving: set[int], items: Sequence[Joining]
    ) -> list[Piece | BaseException]:
        joined: list[Piece | BaseException] = await self._command(("join", leaving, list(items)))
        return joined

    async def run(
        self,
        leaving: set[int],
        stepping: Sequence[tuple[int, Watched]],
        waiting: Callable[[], bool],
        now: Callable[[], float],
        post: Post,
    ) -> BaseException | None:
        at = now()
        left = [(key, stream.deadline - at) for key, stream in stepping]
        self._run = _Run(stepping, waiting, post, set())
        try:
            failed: BaseException | None = await self._command(("run", leaving, left))
        finally:
            self._run = None
        return failed

    # -- the pipes ---------------------------------------------------------------------------

    async def _command(self, command: tuple[Any, ...]) -> Any:
        if self._lost is not None:
            raise self._lost
        loop = asyncio.get_running_loop()
        self._loop = loop
        future: asyncio.Future[Any] = loop.create_future()
        self._pending = future
        data = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) < DIRECT_WRITE_BYTES:
            self._write(data)  # the pipe has room: the child reads every command it is sent
        else:  # a large turn of newcomers may fill the pipe: the child reads it as it can
            await asyncio.to_thread(self._write, data)
        try:
            return await future
        finally:
            self._pending = None

    def _write(self, data: bytes) -> None:
        try:
            with self._write_lock:
                write_frame(self._commands, data)
        except (OSError, ValueError) as exc:
            raise self._lose("writing a command") from exc

    def _lose(self, when: str) -> InstanceLost:
        if self._lost is None:
            self._lost = InstanceLost(self._exit_message(when))
        return self._lost

    def _read(self) -> None:
        """The reader thread: every frame the child sends, until its pipe closes."""
        while True:
            try:
                kind, payload = pickle.loads(read_frame(self._replies))
            except (EOFError, OSError, ValueError):
                self._settle(None, self._lose("while generating"))
                return
            except Exception as exc:  # a frame read whole that does not unpickle
                self._settle(None, RuntimeError(f"cannot read the instance's reply: {exc!r}"))
                continue
            if kind == "step":
                self._stepped(*payload)
            elif kind == "error":
                self._settle(None, payload)
            else:
                result, stats = payload
                if stats is not None:
                    self._prefixes.last, self._prefixes.kept = stats, True
                self._settle(result, None)

    def _stepped(self, pieces: list[Piece], seconds: float) -> None:
        run = self._run
        if run is None:
            return
        # Before the pieces are posted: once the loop has them, their streams read finished.
        run.gone.update(piece.key for piece in pieces if piece.finish is not None)
        run.post(pieces, seconds)
        if not run.stopped and self._changed(run):
            run.stopped = True
            try:
                self._write(pickle.dumps(("stop",), protocol=pickle.HIGHEST_PROTOCOL))
            except InstanceLost:
                pass  # the read of the pipe ends too, and fails the run

    @staticmethod
    def _changed(run: _Run) -> bool:
        """Whether the scheduler has something to decide (read from the reader thread, as a
        thread instance's run reads it from its thread)."""
        if run.waiting():
            return True
        return any(key not in run.gone and stream.status.finished for key, stream in run.stepping)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        loop, future = self._loop, self._pending
        if loop is None or future is None:
            return

        def settle() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the event loop closed (shutting down)
            pass


# -- the child ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Left:
    """A running row as the child's run sees it: its deadline on the child's clock."""

    deadline: float
    status: Status = Status.RUNNING


def _stats(batch: object) -> PrefixStats | None:
    if isinstance(batch, KeepsPrefixes) and batch.prefixes is not None:
        return batch.prefixes.stats()
    return None


def _stop_arrived(requests: IO[bytes]) -> bool:
    """Whether the parent sent ``stop`` (read between two steps without waiting)."""
    if not select.select([requests], [], [], 0)[0]:
        return False
    command = pickle.loads(read_frame(requests))
    return bool(command[0] == "stop")


def _engine_main() -> None:
    """The child of a :class:`GeneratingProcess`: load, warm, then serve the decode loop's
    commands."""
    setup = child_setup()
    if setup is None:
        return
    model, requests, replies = setup
    batch: RunningBatch | None = None
    name = "-"
    while True:
        try:
            command = pickle.loads(read_frame(requests))
        except (EOFError, OSError):
            return  # the parent is gone
        kind = command[0]
        if kind == "stop":
            continue  # the run it meant had ended already
        try:
            if kind == "open":
                batch, positions = open_batch(model)
                answer: tuple[Any, Any] = (positions, _stats(batch))
            elif batch is None:
                raise RuntimeError("the running batch is not open")
            elif kind == "join":
                answer = (join_turn(batch, command[1], command[2], name), _stats(batch))
            elif kind == "run":
                answer = (_run(batch, command[1], command[2], requests, replies), _stats(batch))
            else:
                raise RuntimeError(f"unknown command {kind!r}")
        except Exception as exc:
            if not reply_error(replies, exc):
                return
            continue
        if not reply(replies, ("done", answer)):
            return


def _run(
    batch: RunningBatch,
    leaving: set[int],
    left: list[tuple[int, float]],
    requests: IO[bytes],
    replies: IO[bytes],
) -> BaseException | None:
    now = time.monotonic()
    streams = [(key, _Left(now + seconds)) for key, seconds in left]
    stop = False

    def waiting() -> bool:
        nonlocal stop
        stop = stop or _stop_arrived(requests)
        return stop

    def post(pieces: list[Piece], seconds: float) -> None:
        if not reply(replies, ("step", (pieces, seconds))):
            raise RuntimeError("the parent is gone")

    failed = StepRun(batch, leaving, streams, waiting, time.monotonic, post)(None)
    if failed is not None:
        # Sent back by value: the parent logs it with the streams it fails.
        return RuntimeError(f"{type(failed).__name__}: {failed}")
    return None
