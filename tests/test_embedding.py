"""The app embedded in a host application changes nothing process-wide; ``server.py``, the
composition root, is where the process-wide settings live."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

import server
from batching import BatchingConfig, ModelConfig, create_app
from batching.runtime.collector import YOUNG_THRESHOLD
from batching.settings.cli import parse_settings
from tests.support.asgi import serving

pytestmark = pytest.mark.anyio

ECHO = "tests.support.models:EchoModel"
ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def host_with_batching(ready: asyncio.Event) -> FastAPI:
    inference = create_app(
        ModelConfig(name="echo", source=ECHO, batching=BatchingConfig(max_batch_size=4)),
        on_ready=lambda *_: ready.set(),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with inference.router.lifespan_context(inference):
            yield

    host = FastAPI(lifespan=lifespan)
    host.mount("/ml", inference)
    return host


async def test_an_embedded_app_leaves_the_hosts_gc_environment_and_logging_alone() -> None:
    environ_before = dict(os.environ)
    logger = logging.getLogger("batching")
    logging_before = (logger.level, logger.propagate, list(logger.handlers))
    ready = asyncio.Event()
    with unfrozen():
        thresholds = gc.get_threshold()
        async with LifespanManager(host_with_batching(ready), startup_timeout=30) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://host") as client:
                async with asyncio.timeout(30):
                    await ready.wait()
                assert (await client.get("/ml/v2/health/ready")).status_code == 200
                answer = await client.post("/ml/models/echo", json={"inputs": ["hi"]})
                assert answer.status_code == 200, answer.text
                assert answer.json()["outputs"] == [{"input": "hi", "length": 2}]
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == thresholds
    assert dict(os.environ) == environ_before
    assert (logger.level, logger.propagate, list(logger.handlers)) == logging_before


async def test_the_server_freezes_what_it_loaded_once_a_model_is_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)  # build() sets them; undone after
    settings = parse_settings(["--model", ECHO], {})
    with unfrozen():
        gc.set_threshold(700, 10, 10)  # CPython's defaults
        async with serving(server.build(settings)):
            assert gc.get_freeze_count() > 0
            # Request-scoped objects die young instead of filling the oldest generation.
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


def test_the_server_sets_its_environment_defaults_when_imported() -> None:
    # server.py is imported above, so its defaults are in place for the model libraries.
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


EMBEDDED_HOST = """
import asyncio, contextlib, logging, sys
{configure}
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
import httpx
from batching import ModelConfig, create_app

inference = create_app(ModelConfig(name="echo", source="tests.support.models:EchoModel"))

@contextlib.asynccontextmanager
async def lifespan(app):
    async with inference.router.lifespan_context(inference):
        yield

app = FastAPI(lifespan=lifespan)
app.mount("/ml", inference)

async def main():
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://host") as client:
            for _ in range(2000):
                if (await client.get("/ml/v2/health/ready")).status_code == 200:
                    return
                await asyncio.sleep(0.005)
    sys.exit("never ready")

asyncio.run(main())
"""


@pytest.mark.parametrize("configured", [True, False])
def test_an_embedded_app_logs_only_once_the_host_configures_logging_as_the_readme_shows(
    configured: bool,
) -> None:
    configure = "logging.basicConfig(level=logging.INFO)" if configured else ""
    done = subprocess.run(
        [sys.executable, "-c", EMBEDDED_HOST.format(configure=configure)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    expected = [
        "INFO:batching:loading model echo on cpu (instance 1/1)...",
        "INFO:batching:ready: serving echo",
    ]
    if configured:
        assert all(line in lines for line in expected), lines
    else:
        assert not any("batching" in line for line in lines), lines
