"""Serve an app on a real uvicorn in a thread of its own, for synchronous clients (the
``openai`` SDK, ``tritonclient.http``) and for fixtures shared by a module's tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn
from starlette.types import ASGIApp

from .servers import free_port


@contextlib.contextmanager
def serving_in_thread(app: ASGIApp, *, timeout: float = 60.0) -> Iterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1; yields its base URL once every model is
    ready, and stops (draining) the server on exit."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=free_port(), lifespan="on", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config.port}"
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                raise AssertionError("uvicorn stopped before it started")
            if time.monotonic() > deadline:
                raise AssertionError("uvicorn never started listening")
            time.sleep(0.01)
        with httpx.Client(base_url=url) as client:
            while client.get("/v2/health/ready").status_code != 200:
                if time.monotonic() > deadline:
                    raise AssertionError("the server never became ready")
                time.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout)
