"""Model instances: one model copy on one device, with its own thread (or process).

An instance loads its model, runs its warm-up batches and then runs one batch at a time when
its collector hands it one. Torch never runs on the event loop: every call into the model
happens on the instance's dedicated thread, or in its own process.

- :class:`ThreadInstance` drives its model from one OS thread of the server process. Cheap
  (instances share the interpreter and the imported libraries) and parallel as long as the
  model releases the GIL while it computes, as torch does.
- :class:`ProcessInstance` runs its model in a child process: a fresh interpreter with its
  own copy of the model, for models that hold the GIL (Python-heavy pre- or
  post-processing). Inputs and outputs cross a pipe, pickled. A child that dies surfaces as
  :class:`~batching.batcher.InstanceLost`, and the deployment starts a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import pickle
import random
import signal
import string
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import cycle, islice
from typing import Any, BinaryIO

from .batcher import InstanceLost
from .config import ModelConfig
from .model import Model, load_model

__all__ = [
    "InstanceInfo",
    "ModelFactory",
    "ProcessInstance",
    "ThreadInstance",
    "WarmupPlan",
    "instance_factory_for",
    "load_and_warm",
    "warmup_inputs_for",
]

logger = logging.getLogger("batching")

#: Builds a fresh, unloaded model object. Called once per instance (re)start; for process
#: instances it is pickled into the child, so it must be picklable.
ModelFactory = Callable[[], Model]

#: Words in a generated text when the model does not say how long its inputs may be.
DEFAULT_WARMUP_WORDS = 128

_NUMERIC_TYPES = frozenset(
    {"FP16", "BF16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64"}
    | {"UINT8", "UINT16", "UINT32", "UINT64"}
)


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What an instance learned while loading."""

    load_s: float
    warmup_s: float
    warmup_batches: int
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class WarmupPlan:
    """What an instance runs before it reports ready (``ModelConfig``'s warm-up fields).

    :param batch_sizes: one batch of each size; empty means the model's own plan for
        ``data="model"``, else 1 and ``max_batch_size``.
    :param data: "model" (the samples of the model's ``warmup_inputs``), "zero", "random" or
        "file".
    :param file: with ``data="file"``, a UTF-8 file holding one input per line.
    """

    batch_sizes: tuple[int, ...] = ()
    data: str = "model"
    file: str | None = None

    @classmethod
    def of(cls, config: ModelConfig) -> WarmupPlan:
        return cls(config.warmup_batch_sizes, config.warmup_data, config.warmup_file)


def warmup_inputs_for(
    model: Model, plan: WarmupPlan, max_batch_size: int, seed: int = 0
) -> list[list[Any]]:
    """The warm-up batches ``plan`` asks of a loaded ``model``.

    With ``data="model"`` the items come from the model's ``warmup_inputs`` (none when it has
    no such method). Otherwise the model's metadata decides their type: a BYTES input (or no
    metadata) gets texts, a numeric input with a fixed per-item shape gets nested lists.

    - "zero": empty texts, or zeros;
    - "random": texts of random words as long as the model's ``max_seq_length`` (else
      :data:`DEFAULT_WARMUP_WORDS` words), or uniform numbers; seeded, so reproducible;
    - "file": the file's lines (texts as they are, anything else parsed as JSON), repeated
      to fill each batch.

    :raises RuntimeError: when the data cannot be made for this model (named in the message).
    """
    sizes = list(plan.batch_sizes) or sorted({1, max_batch_size})
    if plan.data == "model":
        own = getattr(model, "warmup_inputs", None)
        if own is None:
            return []
        batches = [list(batch) for batch in own(max_batch_size)]
        if not plan.batch_sizes:
            return batches
        samples = [item for batch in batches for item in batch]
        return [_fill(samples, size) for size in sizes] if samples else []
    datatype, item_shape = _input_spec(model)
    text = datatype == "BYTES"
    if plan.data == "file":
        assert plan.file is not None
        samples = _read_samples(plan.file, text)
        return [_fill(samples, size) for size in sizes]
    if not text and (datatype not in _NUMERIC_TYPES and datatype != "BOOL"):
        raise RuntimeError(f"warm-up data {plan.data!r} cannot make {datatype} inputs")
    if not text and any(not isinstance(dim, int) or dim < 0 for dim in item_shape):
        raise RuntimeError(
            f"warm-up data {plan.data!r} needs a fixed input shape, and the model's metadata "
            f"says {[-1, *item_shape]}; use data from a file instead"
        )
    rng = random.Random(seed) if plan.data == "random" else None
    words = _text_length(model) if text else 0
    return [[_generated(rng, words, datatype, item_shape) for _ in range(size)] for size in sizes]


def _generated(rng: random.Random | None, words: int, datatype: str, shape: tuple[int, ...]) -> Any:
    """One generated input: zero-like without ``rng``, random with it."""
    if datatype == "BYTES":
        return " ".join(_random_word(rng) for _ in range(words)) if rng else ""
    return _tensor(shape, datatype, rng)


def _fill(samples: list[Any], size: int) -> list[Any]:
    return list(islice(cycle(samples), size))


def _input_spec(model: Model) -> tuple[str, tuple[Any, ...]]:
    """The first input's datatype and per-item shape (the metadata shape minus the batch
    dimension); a model without metadata is taken to be a text model."""
    describe = getattr(model, "metadata", None)
    inputs = (describe() or {}).get("inputs") if describe is not None else None
    if not inputs:
        return "BYTES", ()
    first = inputs[0]
    shape = list(first.get("shape") or [-1])
    return str(first.get("datatype", "BYTES")), tuple(shape[1:])


def _text_length(model: Model) -> int:
    length = getattr(model, "max_seq_length", None)
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        # Every word is at least one token, so this many words reach the longest input.
        return length
    return DEFAULT_WARMUP_WORDS


def _random_word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))


def _tensor(shape: tuple[int, ...], datatype: str, rng: random.Random | None) -> Any:
    if shape:
        return [_tensor(shape[1:], datatype, rng) for _ in range(shape[0])]
    if datatype == "BOOL":
        return rng.random() < 0.5 if rng else False
    if datatype.startswith(("INT", "UINT")):
        return rng.randint(0, 100) if rng else 0
    return rng.random() if rng else 0.0


def _read_samples(path: str, text: bool) -> list[Any]:
    samples: list[Any] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if text:
                samples.append(line)
                continue
            try:
                samples.append(json.loads(line))
            except ValueError as exc:
                raise RuntimeError(f"warm-up file {path}, line {number}: not JSON: {exc}") from exc
    if not samples:
        raise RuntimeError(f"warm-up file {path} holds no inputs")
    return samples


def load_and_warm(
    model: Model,
    device: str,
    max_batch_size: int,
    *,
    index: int = 0,
    warmup: WarmupPlan | None = None,
) -> InstanceInfo:
    """Load ``model`` on ``device`` and run its warm-up batches; on the instance's thread
    (or in its process).

    :param index: the instance's position in its model's device list, passed to a ``load``
        that declares ``instance_index``.
    :param warmup: which batches to run; the model's own samples by default.
    :raises RuntimeError: when a warm-up batch fails (the instance must not report ready);
        the message names the batch, its size and the data it was made of.
    """
    plan = warmup or WarmupPlan()
    started = time.perf_counter()
    load_model(model, device, index)
    loaded = time.perf_counter()
    try:
        batches = warmup_inputs_for(model, plan, max_batch_size, seed=index)
    except RuntimeError:
        raise
    except Exception as exc:
        raise RuntimeError(f"making the warm-up inputs ({plan.data} data) failed: {exc!r}") from exc
    for number, batch in enumerate(batches, 1):
        where = f"warm-up batch {number} of {len(batches)} (size {len(batch)}, {plan.data} data)"
        try:
            outputs = model.predict(batch)
        except Exception as exc:
            raise RuntimeError(f"{where} failed: {exc!r}") from exc
        if len(outputs) != len(batch):
            raise RuntimeError(f"{where} returned {len(outputs)} outputs")
    warmed = time.perf_counter()
    describe = getattr(model, "metadata", None)
    metadata = dict(describe()) if describe is not None else {}
    return InstanceInfo(loaded - started, warmed - loaded, len(batches), metadata)


#: How much lower than the event loop the model's threads run (Linux nice increments).
MODEL_NICENESS = 5


def yield_cpu_to_the_server() -> None:
    """Lower the calling thread's CPU priority below the event loop's.

    On a machine whose cores the model's threads fill, the web layer would otherwise queue
    behind them: under overload the answers that say "no" (503) would take as long as the
    ones that compute. At a lower priority the model gets every cycle the event loop does not
    need. The model's own worker threads are created later by this thread, and inherit it.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MODEL_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at normal priority
        pass


def predict_timed(model: Model, inputs: list[Any]) -> tuple[Sequence[Any], float]:
    """Run one batch; return the outputs and the seconds the model took."""
    started = time.perf_counter()
    try:
        outputs = model.predict(inputs)
    except Exception:
        raise
    except BaseException as exc:  # noqa: B036
        # SystemExit and friends would end a plain thread; here they mean the instance is
        # gone, which the deployment answers by restarting it.
        raise InstanceLost(f"the instance died: {exc!r}") from exc
    return outputs, time.perf_counter() - started


class _Instance:
    """What every instance kind holds: its model's factory, device, index and warm-up plan,
    and the one thread that does its blocking work, at a lower CPU priority than the event
    loop (for a thread instance it computes; for a process instance it waits on the pipe)."""

    def __init__(
        self,
        factory: ModelFactory,
        device: str,
        name: str,
        *,
        index: int = 0,
        warmup: WarmupPlan | None = None,
    ) -> None:
        self.device = device
        self.name = name
        self.index = index
        self._factory = factory
        self._warmup = warmup or WarmupPlan()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=yield_cpu_to_the_server
        )


class ThreadInstance(_Instance):
    """A model copy driven by one dedicated OS thread.

    torch releases the GIL while it computes, so instances on threads run batches in
    parallel while the event loop keeps serving HTTP.
    """

    kind = "thread"

    def __init__(
        self,
        factory: ModelFactory,
        device: str,
        name: str,
        *,
        index: int = 0,
        warmup: WarmupPlan | None = None,
    ) -> None:
        super().__init__(factory, device, name, index=index, warmup=warmup)
        self._model: Model | None = None

    async def start(self, max_batch_size: int) -> InstanceInfo:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._load, max_batch_size)

    def _load(self, max_batch_size: int) -> InstanceInfo:
        model = self._factory()
        info = load_and_warm(
            model, self.device, max_batch_size, index=self.index, warmup=self._warmup
        )
        self._model = model
        return info

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        model = self._model
        if model is None:
            raise InstanceLost("the instance has no loaded model")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, predict_timed, model, inputs)

    def close(self) -> None:
        self._model = None
        self._executor.shutdown(wait=False, cancel_futures=True)


class ProcessInstance(_Instance):
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

    def __init__(
        self,
        factory: ModelFactory,
        device: str,
        name: str,
        *,
        index: int = 0,
        warmup: WarmupPlan | None = None,
    ) -> None:
        super().__init__(factory, device, name, index=index, warmup=warmup)
        self._lock = threading.Lock()
        self._closed = False
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        process = self._process
        return None if process is None else process.pid

    async def start(self, max_batch_size: int) -> InstanceInfo:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._spawn, max_batch_size)

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
                [sys.executable, "-c", _CHILD_BOOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._process = process
        self._send(setup, "before loading")
        reply = self._receive("while loading")
        assert isinstance(reply, InstanceInfo)
        return reply

    def _send(self, data: bytes, when: str) -> None:
        process = self._process
        if process is None or process.stdin is None:
            raise InstanceLost("the instance process is not running")
        try:
            _write_frame(process.stdin, data)
        except (OSError, ValueError) as exc:  # ValueError: the pipe was closed here
            raise InstanceLost(self._exit_message(when)) from exc

    def _receive(self, when: str) -> Any:
        process = self._process
        if process is None or process.stdout is None:
            raise InstanceLost("the instance process is not running")
        try:
            frame = _read_frame(process.stdout)
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

    def _call(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        self._send(pickle.dumps(inputs, protocol=pickle.HIGHEST_PROTOCOL), "before a batch")
        result = self._receive("during a batch")
        return result  # type: ignore[no-any-return]

    async def run(self, inputs: list[Any]) -> tuple[Sequence[Any], float]:
        if self._closed:
            raise InstanceLost("the instance is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, inputs)

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


#: What the child runs: nothing of the parent's ``__main__``, only this module's entry point.
_CHILD_BOOT = "from batching.instances import _child_main; _child_main()"

_FRAME_HEADER = struct.Struct("!Q")


def _write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(_FRAME_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("the pipe closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream: BinaryIO) -> bytes:
    (size,) = _FRAME_HEADER.unpack(_read_exactly(stream, _FRAME_HEADER.size))
    return _read_exactly(stream, size)


def _child_main() -> None:
    """The child process of a :class:`ProcessInstance`: load, warm, then serve batches."""
    # The frames own the original stdin and stdout; the model's prints go to stderr, and
    # its reads of stdin see an empty file.
    requests = os.fdopen(os.dup(0), "rb")
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
        factory, device, index, warmup, max_batch_size = pickle.loads(_read_frame(requests))
    except EOFError:
        return
    try:
        model = factory()
        info = load_and_warm(model, device, max_batch_size, index=index, warmup=warmup)
    except BaseException as exc:  # noqa: B036
        _reply_error(replies, exc)
        return
    if not _reply(replies, ("ok", info)):
        return
    while True:
        try:
            inputs = pickle.loads(_read_frame(requests))
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            result = predict_timed(model, inputs)
        except InstanceLost as exc:
            _reply_error(replies, exc)
            return
        except Exception as exc:
            if not _reply_error(replies, exc):
                return
            continue
        if not _reply(replies, ("ok", result)):
            return


def _reply(stream: BinaryIO, message: tuple[str, Any]) -> bool:
    """Send ``message``; False when the parent is gone."""
    try:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return _reply_error(
            stream, RuntimeError(f"the instance process cannot send its outputs back: {exc!r}")
        )
    try:
        _write_frame(stream, data)
    except OSError:
        return False
    return True


def _reply_error(stream: BinaryIO, exc: BaseException) -> bool:
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
        _write_frame(stream, data)
    except OSError:
        return False
    return True


def instance_factory_for(
    config: ModelConfig, index: int
) -> Callable[[ModelFactory, str, str], ThreadInstance | ProcessInstance]:
    """The default way to build instance ``index`` of ``config``: a thread or a process
    (``config.instance_kind``), told its index and the model's warm-up plan."""
    cls = ProcessInstance if config.instance_kind == "process" else ThreadInstance
    return functools.partial(cls, index=index, warmup=WarmupPlan.of(config))
