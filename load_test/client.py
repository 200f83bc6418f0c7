"""The request loops: closed loop (N clients, each sends when its last answer came) and open
loop (requests sent at scheduled times, whatever the server is doing).

Each request records four clock readings (``time.monotonic()``, one clock for the whole run):

- ``intended``: when it should have been sent (open loop: its scheduled time; closed loop:
  the moment its client was free, which is the same as ``dispatched``);
- ``dispatched``: when the tool got round to it (lateness here is the tool's own lag);
- ``sent``: when its bytes were written (after waiting for a free connection);
- ``done``: when the last byte of the answer arrived, or the request failed.

Latency is ``done - intended``: in open loop, time a request spent waiting because the server
held every connection, or because the tool was late, counts against the server's latency
instead of vanishing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from load_test.http1 import ConnectionPool, HttpProtocol, Response, StaleConnection, build_request
from load_test.payloads import PayloadSet
from load_test.procstat import machine_cpu_seconds, tree_cpu_seconds
from load_test.schedule import Segment, arrivals, expected_count
from load_test.stats import CONNECTION_ERROR, INVALID, TIMEOUT

if TYPE_CHECKING:
    from load_test.grpc_client import GrpcSender

__all__ = [
    "CONNECTION_ERROR",
    "DEFAULT_GRPC_PORT",
    "INVALID",
    "TIMEOUT",
    "LoadSpec",
    "Recorder",
    "RunResult",
    "Target",
    "count_outputs",
    "run_load",
]


#: The port of the server's gRPC door unless told otherwise (``--grpc-port``'s default).
DEFAULT_GRPC_PORT = 8001


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: ``http://host:port[/prefix]`` (``https`` goes through httpx)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.prefix}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    @property
    def grpc_default(self) -> str:
        """The gRPC door on the same host, at the server's default gRPC port."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{DEFAULT_GRPC_PORT}"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What to send: closed loop when ``concurrency`` is set, else open loop on ``segments``."""

    payloads: PayloadSet
    concurrency: int | None = None
    segments: tuple[Segment, ...] = ()
    process: str = "poisson"
    seed: int = 0
    requests: int | None = None
    duration: float | None = None
    timeout: float = 60.0
    max_connections: int = 256
    validate: bool = True
    #: "raw" (the cheap built-in HTTP/1.1 client) or "httpx"; https always uses httpx.
    http_client: str = "raw"
    #: ``host:port`` of the gRPC door, for the ``grpc`` API (default: the URL's host, port
    #: :data:`DEFAULT_GRPC_PORT`).
    grpc_target: str | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (not self.segments):
            raise ValueError("give either a concurrency (closed loop) or rate segments")
        if self.http_client not in ("raw", "httpx"):
            raise ValueError("http_client must be raw or httpx")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.requests is None and self.duration is None and self.concurrency is not None:
            raise ValueError("a closed loop needs a number of requests or a duration")
        if self.segments and self.requests is None and math.isinf(expected_count(self.segments)):
            raise ValueError("an endless rate needs a number of requests or a duration")

    @property
    def mode(self) -> str:
        return "closed" if self.concurrency is not None else "open"


@dataclass(slots=True)
class Recorder:
    """Per-request measurements in columns, appended to without allocation per field."""

    intended: list[float] = field(default_factory=list)
    dispatched: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    phase: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    ok: int = 0

    def __len__(self) -> int:
        return len(self.status)

    def add(
        self,
        intended: float,
        dispatched: float,
        sent: float,
        done: float,
        status: int,
        items: int,
        phase: int,
    ) -> None:
        self.intended.append(intended)
        self.dispatched.append(dispatched)
        self.sent.append(sent)
        self.done.append(done)
        self.status.append(status)
        self.items.append(items)
        self.phase.append(phase)
        if status == 200:
            self.ok += 1


@dataclass(slots=True)
class RunResult:
    """A finished run: its records and what the tool observed of itself."""

    spec: LoadSpec
    records: Recorder
    start: float
    end: float
    cpu_s: float
    loop_lags: list[float]
    max_in_flight: int
    connections_opened: int
    #: Share of all the machine's CPU time that was busy during the run.
    machine_cpu_busy: float | None
    #: CPU seconds the server's process tree used during the run, when its pid was given.
    server_cpu_s: float | None = None

    @property
    def wall_s(self) -> float:
        return self.end - self.start


def count_outputs(api: str, body: bytes, header_length: int | None = None) -> int | None:
    """How many results a 200 body holds, or None when it is not a well-formed answer.

    ``header_length`` is a binary v2 answer's ``Inference-Header-Content-Length``: its JSON
    header is that many bytes, and the outputs' ``binary_data_size`` must add up to the rest.
    """
    binary: int | None = None
    if header_length is not None:
        if not 0 <= header_length <= len(body):
            return None
        binary = len(body) - header_length
        body = body[:header_length]
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    if api == "openai":
        vectors = data.get("data")
        return len(vectors) if isinstance(vectors, list) else None
    outputs = data.get("outputs")
    if not isinstance(outputs, list):
        return None
    if api not in ("v2", "v2-binary"):
        return len(outputs)
    if not outputs or not isinstance(outputs[0], dict):
        return None
    if binary is not None and binary != _binary_sizes(outputs):
        return None
    shape = outputs[0].get("shape")
    if isinstance(shape, list) and shape and isinstance(shape[0], int):
        return shape[0]
    return None


def _binary_sizes(outputs: list[Any]) -> int | None:
    """The bytes of binary data a v2 answer's outputs announce, or None if one is malformed."""
    total = 0
    for output in outputs:
        if not isinstance(output, dict):
            return None
        parameters = output.get("parameters") or {}
        size = parameters.get("binary_data_size", 0) if isinstance(parameters, dict) else None
        if not isinstance(size, int) or size < 0:
            return None
        total += size
    return total


class _Sender:
    """Sends payload ``index`` and reports ``(sent, Response)``; raw HTTP/1.1 for http://."""

    def __init__(self, target: Target, spec: LoadSpec, limit: int) -> None:
        self.spec = spec
        payloads = spec.payloads
        path = target.prefix + payloads.path
        self._raw = [
            build_request(target.host_header, path, payloads.content_type, p.body, p.headers)
            for p in payloads.payloads
        ]
        self._pool = ConnectionPool(target.host, target.port, limit)

    @property
    def opened(self) -> int:
        return self._pool.opened

    async def send(self, index: int, deadline: float) -> tuple[float, Response]:
        data = self._raw[index % len(self._raw)]
        for attempt in (1, 2):
            conn = await self._pool.acquire(fresh=attempt > 1)
            reused = conn.used
            try:
                return await self._exchange(conn, data, deadline)
            except StaleConnection:
                # A kept-alive connection the server had just closed: the request never
                # reached it, so one retry on a new connection is honest. A new connection
                # closed without an answer is the server's failure.
                if attempt > 1 or not reused:
                    raise ConnectionResetError("closed without an answer") from None
        raise AssertionError("unreachable")

    async def _exchange(
        self, conn: HttpProtocol, data: bytes, deadline: float
    ) -> tuple[float, Response]:
        reusable = False
        loop = asyncio.get_running_loop()
        handle = loop.call_at(deadline, conn.abort, TimeoutError("client timeout"))
        try:
            sent = time.monotonic()
            response = await conn.request(data)
            reusable = response.keep_alive
            return sent, response
        finally:
            handle.cancel()
            self._pool.release(conn, reusable)

    async def aclose(self) -> None:
        self._pool.close()


class _HttpxSender:
    """httpx for https:// targets: correct but costly per request (see load_test.http1)."""

    def __init__(self, target: Target, spec: LoadSpec, limit: int) -> None:
        import httpx

        self._httpx = httpx
        self.spec = spec
        self._url = target.url(spec.payloads.path)
        self._headers = {"content-type": spec.payloads.content_type}
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        self._client = httpx.AsyncClient(limits=limits, timeout=None)
        self.opened = 0

    async def send(self, index: int, deadline: float) -> tuple[float, Response]:
        payload = self.spec.payloads.payloads[index % len(self.spec.payloads)]
        headers = {**self._headers, **dict(payload.headers)} if payload.headers else self._headers
        sent = time.monotonic()
        timeout = max(deadline - sent, 0.001)
        try:
            answer = await asyncio.wait_for(
                self._client.post(self._url, content=payload.body, headers=headers),
                timeout,
            )
        except self._httpx.TransportError as exc:
            raise ConnectionError(type(exc).__name__) from exc
        done = time.monotonic()
        length = answer.headers.get("inference-header-content-length")
        header_length = None
        if length is not None:
            header_length = int(length) if length.isdigit() else -1
        return sent, Response(answer.status_code, answer.content, True, done, header_length)

    async def aclose(self) -> None:
        await self._client.aclose()


ProgressHook = Callable[[Recorder, float], None]


class _Runner:
    def __init__(
        self,
        target: Target,
        spec: LoadSpec,
        progress: ProgressHook | None,
        server_pid: int | None,
    ) -> None:
        self.spec = spec
        self.server_pid = server_pid
        self.records = Recorder()
        self.progress = progress
        limit = spec.concurrency if spec.concurrency is not None else spec.max_connections
        self.sender: _Sender | _HttpxSender | GrpcSender
        if spec.payloads.api == "grpc":
            from load_test.grpc_client import GrpcSender

            grpc_target = spec.grpc_target or target.grpc_default
            self.sender = GrpcSender(grpc_target, spec.payloads, limit, spec.mode == "open")
        elif target.scheme == "https" or spec.http_client == "httpx":
            self.sender = _HttpxSender(target, spec, limit)
        else:
            self.sender = _Sender(target, spec, limit)
        self.in_flight = 0
        self.max_in_flight = 0
        self.loop_lags: list[float] = []
        self.start = 0.0
        self._issued = 0
        self._stop_at = math.inf

    async def one(self, index: int, intended: float, phase: int) -> None:
        spec = self.spec
        dispatched = time.monotonic()
        items = spec.payloads.payloads[index % len(spec.payloads)].items
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        sent = dispatched
        try:
            sent, response = await self.sender.send(index, dispatched + spec.timeout)
        except TimeoutError:
            self._fail(intended, dispatched, sent, TIMEOUT, items, phase, "timeout")
        except (ConnectionError, OSError) as exc:
            self._fail(intended, dispatched, sent, CONNECTION_ERROR, items, phase, exc)
        else:
            status = response.status
            if status == 200 and spec.validate:
                outputs = response.outputs
                if outputs is None:
                    outputs = count_outputs(
                        spec.payloads.api, response.body, response.header_length
                    )
                if outputs != items:
                    status = INVALID
                    reason = "malformed" if outputs is None else f"{outputs} outputs"
                    self.records.errors[f"invalid: {reason} for {items} inputs"] += 1
            self.records.add(intended, dispatched, sent, response.done, status, items, phase)
        finally:
            self.in_flight -= 1

    def _fail(
        self,
        intended: float,
        dispatched: float,
        sent: float,
        status: int,
        items: int,
        phase: int,
        why: BaseException | str,
    ) -> None:
        name = why if isinstance(why, str) else type(why).__name__
        self.records.errors[name] += 1
        self.records.add(intended, dispatched, sent, time.monotonic(), status, items, phase)

    async def closed_worker(self) -> None:
        requests = self.spec.requests
        while True:
            if requests is not None and self._issued >= requests:
                return
            now = time.monotonic()
            if now >= self._stop_at:
                return
            index = self._issued
            self._issued += 1
            await self.one(index, now, 0)

    async def open_dispatcher(self) -> None:
        spec = self.spec
        tasks: set[asyncio.Task[None]] = set()
        schedule: Iterator[tuple[float, int]] = arrivals(spec.segments, spec.process, spec.seed)
        for index, (offset, phase) in enumerate(schedule):
            if spec.requests is not None and index >= spec.requests:
                break
            if spec.duration is not None and offset >= spec.duration:
                break
            intended = self.start + offset
            delay = intended - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self.one(index, intended, phase))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def watch_loop(self) -> None:
        # The event loop's own lateness, sampled: the closed loop's view of the tool's lag.
        period = 0.01
        while True:
            before = time.monotonic()
            await asyncio.sleep(period)
            self.loop_lags.append(time.monotonic() - before - period)

    async def report_progress(self) -> None:
        assert self.progress is not None
        while True:
            self.progress(self.records, time.monotonic() - self.start)
            await asyncio.sleep(0.25)

    async def run(self) -> RunResult:
        spec = self.spec
        busy_before = machine_cpu_seconds()
        server_before = tree_cpu_seconds(self.server_pid) if self.server_pid else None
        cpu_before = time.process_time()
        self.start = time.monotonic()
        if spec.duration is not None:
            self._stop_at = self.start + spec.duration
        helpers = [asyncio.create_task(self.watch_loop())]
        if self.progress is not None:
            helpers.append(asyncio.create_task(self.report_progress()))
        try:
            if spec.concurrency is not None:
                workers = [self.closed_worker() for _ in range(spec.concurrency)]
                await asyncio.gather(*workers)
            else:
                await self.open_dispatcher()
        finally:
            for helper in helpers:
                helper.cancel()
            await self.sender.aclose()
        end = time.monotonic()
        cpu_s = time.process_time() - cpu_before
        if self.progress is not None:
            self.progress(self.records, end - self.start)
        busy_after = machine_cpu_seconds()
        server_after = tree_cpu_seconds(self.server_pid) if self.server_pid else None
        machine = None
        if busy_before and busy_after and busy_after[1] > busy_before[1]:
            machine = (busy_after[0] - busy_before[0]) / (busy_after[1] - busy_before[1])
        server_cpu = None
        if server_before is not None and server_after is not None:
            server_cpu = max(server_after - server_before, 0.0)
        return RunResult(
            spec=spec,
            records=self.records,
            start=self.start,
            end=end,
            cpu_s=cpu_s,
            loop_lags=self.loop_lags,
            max_in_flight=self.max_in_flight,
            connections_opened=self.sender.opened,
            machine_cpu_busy=machine,
            server_cpu_s=server_cpu,
        )


async def run_load(
    target: Target,
    spec: LoadSpec,
    progress: ProgressHook | None = None,
    server_pid: int | None = None,
) -> RunResult:
    """Send the load described by ``spec`` to ``target`` and return what was measured.

    ``server_pid``, for a server on this machine, lets the run tell the server's CPU use
    apart from the rest of the machine's.
    """
    return await _Runner(target, spec, progress, server_pid).run()


def client_facts() -> dict[str, Any]:
    """Facts about the client machine worth keeping beside a result."""
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": sys.platform}
