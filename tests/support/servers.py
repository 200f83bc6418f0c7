"""Run an app on a real uvicorn bound to 127.0.0.1, inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
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
    """Serve ``app`` on a free port; yields its base URL once it accepts (and is ready)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=free_port(), lifespan="on", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(3000):
            if server.started:
                break
            if task.done():
                task.result()
                raise AssertionError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)  # uvicorn offers no started event to await
        else:
            raise AssertionError("uvicorn never started listening")
        url = f"http://127.0.0.1:{config.port}"
        if wait_ready:
            # The first start of a model with --engine auto exports and measures it.
            deadline = time.monotonic() + 90
            async with httpx.AsyncClient(base_url=url) as client:
                while (await client.get("/v2/health/ready")).status_code != 200:
                    if time.monotonic() > deadline:
                        raise AssertionError("the server never became ready")
                    await asyncio.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        await task
