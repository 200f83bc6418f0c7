"""Process instances: a model copy in its own child process, for models that hold the GIL.

Inputs and outputs cross a pipe, pickled. A child that dies surfaces as
:class:`~batching.core.jobs.InstanceLost`, and the deployment starts a new one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import traceback
from typing import IO, cast

from batching.core.jobs import InstanceLost, Outputs
from batching.models.items import Item
from batching.models.protocol import Model

from .base import InstanceBase, predict_timed, yield_cpu_to_the_server
from .warmup import InstanceInfo, Loaded, load_and_warm

__all__ = ["ProcessInstance", "child_setup", "read_frame", "reply", "reply_error", "write_frame"]


class ProcessInstance(InstanceBase):
    """A model copy in its own child process, for models that hold the GIL.

    The child is a fresh interpreter (``python -c``, the same executable), never a ``fork``
    of the server: a forked copy of a process with threads and a running event loop is
    unsafe. Unlike ``multiprocessing``'s ``spawn`` it does not re-run the parent's
    ``__main__`` (``server.py``, a script that calls ``uvicorn.run``, ...): it imports only
    :mod:`batching` and what unpickling the model factory needs. It inherits the environment
    (``HF_HUB_OFFLINE`` included) and the parent's ``sys.path``.

    Requests and replies are pickled, length-prefixed frames on the child's stdin and stdout;
    the child points its own ``sys.stdout`` at stderr so that a model's prints cannot corrupt
    them. One parent thread does the blocking pipe I/O, which keeps each request paired with
    its reply. Model exceptions come back as themselves (so the batcher's bisection works); a
    child that dies, is killed or exits raises :class:`InstanceLost`.
    """

    kind = "process"
    #: What the child runs (a module's entry point, nothing of the parent's ``__main__``).
    boot = "from batching.runtime.process import _child_main; _child_main()"

    _closed = False
    _process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        process = self._process
        return None if process is None else process.pid

    async def start(self, max_batch_size: int) -> InstanceInfo:
        return await self._executor.call_soon(self._spawn, max_batch_size)

    def _spawn(self, max_batch_size: int) -> InstanceInfo:
        try:
            setup = pickle.dumps(
                (self._factory, self.device, self.index, self._warmup, max_batch_size)
            )
        except Exception as exc:
            raise RuntimeError(f"process instances need a picklable model factory: {exc}") from exc
        path = [os.path.abspath(entry) if entry else os.getcwd() for entry in sys.path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        with self._lock:
            if self._closed:
                raise InstanceLost("the instance was closed before it started")
            # Under the lock, so that close() either sees the process or prevents it.
            process = subprocess.Popen(
                [sys.executable, "-c", self.boot],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._process = process
        self._send(setup, "before loading")
        reply = self._receive("while loading")
        if isinstance(reply, Loaded):  # the model is loaded; the warm-up runs next
            self.report_loaded(reply)
            reply = self._receive("while warming up")
        assert isinstance(reply, InstanceInfo)
        return reply

    def _send(self, data: bytes, when: str) -> None:
        process = self._process
        if process is None or process.stdin is None:
            raise InstanceLost("the instance process is not running")
        try:
            write_frame(process.stdin, data)
        except (OSError, ValueError) as exc:  # ValueError: the pipe was closed here
            raise InstanceLost(self._exit_message(when)) from exc

    def _receive(self, when: str) -> object:
        process = self._process
        if process is None or process.stdout is None:
            raise InstanceLost("the instance process is not running")
        try:
            frame = read_frame(process.stdout)
        except (EOFError, OSError, ValueError) as exc:
            raise InstanceLost(self._exit_message(when)) from exc
        try:
            status, payload = pickle.loads(frame)
        except Exception as exc:
            # The frame was read whole, so the pipe stays in step for the next batch.
            raise RuntimeError(f"cannot read the instance process's reply: {exc!r}") from exc
        if status == "error":
            raise payload
        return payload

    def _exit_message(self, when: str) -> str:
        process = self._process
        if process is None:
            return f"the instance process is gone {when}"
        try:
            # The pipe closes a moment before the exit status is known.
            code: int | None = process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"the instance process {process.pid} {how} {when}"

    def _call(self, inputs: list[Item]) -> tuple[Outputs, float]:
        self._send(pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL), "before a batch")
        # The child answers a batch with what predict_timed returned (see _child_main).
        return cast("tuple[Outputs, float]", self._receive("during a batch"))

    async def run(self, inputs: list[Item]) -> tuple[Outputs, float]:
        if self._closed:
            raise InstanceLost("the instance is closed")
        return await self._executor.call_soon(self._call, inputs)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            process = self._process
        if process is not None and process.poll() is None:
            # The parent owns the child's lifetime; a kill is immediate even mid-batch, and
            # a pending read of its pipe then ends with EOF.
            process.kill()
        # Reaped on the instance's own thread, after any call still reading the pipe:
        # closing a pipe under a blocked reader could hand its descriptor to someone else.
        self._executor.submit(self._reap)
        self._executor.shutdown(wait=False)

    def _reap(self) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5.0)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


_FRAME_HEADER = struct.Struct("!Q")


def write_frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(_FRAME_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("the pipe closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: IO[bytes]) -> bytes:
    (size,) = _FRAME_HEADER.unpack(_read_exactly(stream, _FRAME_HEADER.size))
    return _read_exactly(stream, size)


def child_setup() -> tuple[object, IO[bytes], IO[bytes]] | None:
    """In the child process: take the frames' pipes, load and warm the model the parent
    sends, and tell the parent. The model and the pipes (requests, replies); None when
    loading failed (the parent was told) or the parent is gone."""
    # The frames own the original stdin and stdout; the model's prints go to stderr, and
    # its reads of stdin see an empty file.
    # Unbuffered: nothing of a later frame is read ahead where select() cannot see it.
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb")
    sys.stdout.flush()
    os.dup2(2, 1)
    with open(os.devnull, "rb") as empty:
        os.dup2(empty.fileno(), 0)
    # Ctrl-C reaches the whole process group; the parent decides when its children end, and
    # one traceback per child would bury the server's own shutdown lines.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield_cpu_to_the_server()
    try:
        factory, device, index, warmup, max_batch_size = pickle.loads(read_frame(requests))
    except EOFError:
        return None

    def loaded(progress: Loaded) -> None:
        reply(replies, ("ok", progress))

    try:
        model = factory()
        info = load_and_warm(
            model, device, max_batch_size, index=index, warmup=warmup, on_loaded=loaded
        )
    except BaseException as exc:  # noqa: B036
        reply_error(replies, exc)
        return None
    if not reply(replies, ("ok", info)):
        return None
    return model, requests, replies


def _child_main() -> None:
    """The child process of a :class:`ProcessInstance`: load, warm, then serve batches."""
    setup = child_setup()
    if setup is None:
        return
    model, requests, replies = setup
    while True:
        try:
            inputs = pickle.loads(read_frame(requests))
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            result = predict_timed(cast("Model", model), inputs)
        except InstanceLost as exc:
            reply_error(replies, exc)
            return
        except Exception as exc:
            if not reply_error(replies, exc):
                return
            continue
        if not reply(replies, ("ok", result)):
            return


def reply(stream: IO[bytes], message: tuple[str, object]) -> bool:
    """Send ``message``; False when the parent is gone."""
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return reply_error(
            stream, RuntimeError(f"the instance process cannot send its outputs back: {exc!r}")
        )
    try:
        write_frame(stream, data)
    except OSError:
        return False
    return True


def reply_error(stream: IO[bytes], exc: BaseException) -> bool:
    if not isinstance(exc, Exception):
        exc = InstanceLost(f"the instance died: {exc!r}")
    if exc.__traceback__ is not None:
        # The parent's log would otherwise show only where the exception was re-raised.
        exc.add_note("in the instance process:\n" + "".join(traceback.format_exception(exc)))
    try:
        data = pickle.dumps(("error", exc), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    try:
        write_frame(stream, data)
    except OSError:
        return False
    return True
