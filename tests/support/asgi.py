"""The ASGI app in-process: a client with the lifespan running, and apps around test models."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette

from batching import BatchingConfig, ModelConfig, create_app


def echo_config(name: str = "echo", **batching: Any) -> ModelConfig:
    return ModelConfig(name=name, batching=BatchingConfig(**batching))


@contextlib.asynccontextmanager
async def serving(app: Starlette, *, wait_ready: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    async with LifespanManager(app, startup_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            if wait_ready:
                await wait_until_ready(client)
            yield client


async def wait_until_ready(client: httpx.AsyncClient) -> None:
    for _ in range(2000):
        if (await client.get("/v2/health/ready")).status_code == 200:
            return
        await asyncio.sleep(0.005)  # polling a probe, as any orchestrator does
    raise AssertionError("never became ready")


def app_with(model: Any, config: ModelConfig | None = None, **kwargs: Any) -> Starlette:
    builder: Callable[[ModelConfig], Any] = lambda _: model  # noqa: E731
    return create_app(config or echo_config(), builder=builder, **kwargs)
