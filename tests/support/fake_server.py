"""A fast stand-in for the batching server, for testing ``load_test`` as a black box.

It answers the same URLs with the same bodies (plain, JSON and KServe v2 inference,
``/v2/health/ready``, ``/metrics`` with the ``batching_batch_size_items`` histogram), and can
be told to fail some requests or to stall. With a batch cost set, it batches for real: items
queue, ``instances`` workers take up to ``max_batch_size`` of them, waiting at most
``max_queue_delay`` for more, and "compute" for ``a + b * n`` ms, so the settings that
``tune`` searches change its throughput the way they change a real model's.

In-process (tests): ``with serve(FakeSettings(...)) as url:``. As a process (for the
commands that start a server): ``python -m tests.support.fake_server --port P [server flags]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["FakeServer", "FakeSettings", "main", "serve"]

_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class FakeSettings:
    model_name: str = "fake"
    max_batch_size: int = 32
    max_queue_delay_ms: float = 2.0
    instances: int = 1
    #: Batch cost a + b*n in ms; both 0 answers at once, each request its own batch.
    cost_a_ms: float = 0.0
    cost_b_ms: float = 0.0
    #: Request k (in arrival order) fails with ``failures[k % failure_period]`` if present.
    failures: dict[int, int] = field(default_factory=dict)
    failure_period: int = 10
    #: The request with this arrival index freezes the server for ``stall_s`` seconds.
    stall_at: int | None = None
    stall_s: float = 0.0


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


class FakeServer:
    """The app and its state; every answer is decided on the event loop, so no locks."""

    def __init__(self, settings: FakeSettings) -> None:
        self.settings = settings
        self.arrivals = 0
        self.batches: list[int] = []
        self.stalled_until = 0.0
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self.app = Starlette(
            routes=[
                Route("/", self.plain, methods=["POST"]),
                Route("/v2/models/{name}/infer", self.infer, methods=["POST"]),
                Route("/v2/models/{name}", self.model_meta, methods=["GET"]),
                Route("/v2/health/ready", self.ready, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ]
        )

    async def ready(self, request: Request) -> Response:
        return _json({"ready": True})

    async def model_meta(self, request: Request) -> Response:
        if request.path_params["name"] != self.settings.model_name:
            return _json({"error": "no such model"}, 404)
        return _json({"name": self.settings.model_name, "platform": "fake"})

    async def plain(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            inputs = orjson.loads(body)["inputs"]
        else:
            inputs = [body.decode("utf-8")]
        status, outputs = await self._handle(inputs)
        if status != 200:
            return _json({"error": "fake failure"}, status)
        return _json({"model": self.settings.model_name, "outputs": outputs})

    async def infer(self, request: Request) -> Response:
        tensor = orjson.loads(await request.body())["inputs"][0]
        status, outputs = await self._handle(tensor["data"])
        if status != 200:
            return _json({"error": "fake failure"}, status)
        answer = {"name": "embedding", "datatype": "INT64", "shape": [len(outputs), 1]}
        answer["data"] = outputs
        return _json({"model_name": self.settings.model_name, "outputs": [answer]})

    async def _handle(self, inputs: list[Any]) -> tuple[int, list[Any]]:
        s = self.settings
        index = self.arrivals
        self.arrivals += 1
        loop = asyncio.get_running_loop()
        if s.stall_at is not None and index == s.stall_at:
            self.stalled_until = loop.time() + s.stall_s
        if loop.time() < self.stalled_until:
            # The fake's stall is its behaviour under test, not synchronisation.
            await asyncio.sleep(self.stalled_until - loop.time())
        code = s.failures.get(index % s.failure_period)
        if code is not None:
            return code, []
        if s.cost_a_ms == 0 and s.cost_b_ms == 0:
            self.batches.append(len(inputs))
            return 200, [len(str(x)) for x in inputs]
        futures = [self._enqueue(x) for x in inputs]
        return 200, list(await asyncio.gather(*futures))

    def _enqueue(self, item: Any) -> asyncio.Future[Any]:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._workers = [
                asyncio.create_task(self._worker()) for _ in range(self.settings.instances)
            ]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return future

    async def _worker(self) -> None:
        s = self.settings
        assert self._queue is not None
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            deadline = loop.time() + s.max_queue_delay_ms / 1000
            while len(batch) < s.max_batch_size:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            self.batches.append(len(batch))
            await asyncio.sleep((s.cost_a_ms + s.cost_b_ms * len(batch)) / 1000)
            for item, future in batch:
                if not future.done():
                    future.set_result(len(str(item)))

    async def metrics(self, request: Request) -> Response:
        name = "batching_batch_size_items"
        label = f'model="{self.settings.model_name}"'
        lines = [f"# HELP {name} Items per batch run.", f"# TYPE {name} histogram"]
        for le in _BUCKETS:
            count = sum(1 for b in self.batches if b <= le)
            lines.append(f'{name}_bucket{{{label},le="{float(le)}"}} {float(count)}')
        lines.append(f'{name}_bucket{{{label},le="+Inf"}} {float(len(self.batches))}')
        lines.append(f"{name}_sum{{{label}}} {float(sum(self.batches))}")
        lines.append(f"{name}_count{{{label}}} {float(len(self.batches))}")
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


@contextlib.contextmanager
def serve(settings: FakeSettings) -> Iterator[tuple[str, FakeServer]]:
    """Serve a fake on a free port in a background thread; yields ``(url, server)``.

    The socket listens before the thread starts, so a client can connect at once: the
    kernel queues the connection until uvicorn accepts it, and no readiness wait is needed.
    """
    fake = FakeServer(settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        fake.app, log_level="warning", lifespan="off", ws="none", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fake batching server for load_test's tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--cost-a-ms", type=float, default=2.0)
    parser.add_argument("--cost-b-ms", type=float, default=0.2)
    args, _ = parser.parse_known_args(argv)  # the real server's other flags don't apply
    settings = FakeSettings(
        max_batch_size=args.max_batch_size,
        max_queue_delay_ms=args.max_queue_delay_ms,
        instances=args.instances,
        cost_a_ms=args.cost_a_ms,
        cost_b_ms=args.cost_b_ms,
    )
    uvicorn.run(
        FakeServer(settings).app,
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="off",
        ws="none",
        access_log=False,
    )


if __name__ == "__main__":
    main()
