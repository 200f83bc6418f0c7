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


def _failed_loads(client: httpx.Client) -> list[object]:
    """The repository index's entries whose load failed (none when the index is refused,
    e.g. for want of a key): such a server never becomes ready, so waiting is pointless."""
    answer = client.post("/v2/repository/index", json={})
    if answer.status_code != 200:
        return []
    return [entry for entry in answer.json() if entry.get("state") == "UNAVAILABLE"]


@contextlib.contextmanager
def serving_in_thread(app: ASGIApp, *, timeout: float = 60.0) -> Iterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1; yields its base URL once every model is
    ready (fails at once when a model's load failed), and stops (draining) the server on
    exit."""
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
                failed = _failed_loads(client)
                if failed:
                    raise AssertionError(f"a model failed to load: {failed}")
                if time.monotonic() > deadline:
                    raise AssertionError("the server never became ready")
                time.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout)
