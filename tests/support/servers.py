"""Run an app on a real uvicorn bound to 127.0.0.1, inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.types import ASGIApp


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def running(app: ASGIApp, *, wait_ready: bool = True) -> AsyncIterator[str]:
    """Serve ``app`` on a free port; yields its base URL once it accepts (and is ready).

    The socket is bound here and handed to uvicorn: a port picked first and bound later can be
    taken meanwhile by another test's server (two workers run side by side)."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = int(listening.getsockname()[1])
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        # States, not time budgets: a busy machine starts slower, and pytest's own timeout
        # bounds a start that hangs.
        while not server.started:
            if task.done():
                task.result()
                raise AssertionError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)  # uvicorn offers no started event to await
        url = f"http://127.0.0.1:{port}"
        if wait_ready:
            # The first start of a model with --engine auto exports and checks it.
            async with httpx.AsyncClient(base_url=url, timeout=None) as client:
                while (await client.get("/v2/health/ready")).status_code != 200:
                    if task.done():
                        raise AssertionError("the server stopped before it became ready")
                    await asyncio.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        try:
            await task
        finally:
            listening.close()
