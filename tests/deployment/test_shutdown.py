"""SIGTERM under load, on a real ``python server.py`` process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.metrics import sample
from tests.support.servers import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def cost_server(
    a_ms: int, b_ms: int, *flags: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, list[str]]]:
    """``python server.py`` on a CostModel whose batch of n takes ``a_ms + b_ms * n``,
    ready; yields the process, its URL and (after the block) its whole output."""
    port = free_port()
    env = {**os.environ, "COST_MODEL_A_MS": str(a_ms), "COST_MODEL_B_MS": str(b_ms)}
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "server.py", "--model", "tests.support.models:CostModel"],
        *["--port", str(port), "--shutdown-timeout-s", "20", *flags],
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    output: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for _ in range(1500):
                try:
                    if (await client.get("/v2/health/ready")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.02)  # polling a subprocess's readiness, with a deadline
            else:
                raise AssertionError("server never became ready")
        yield process, url, output
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        assert process.stdout is not None
        output.append((await process.stdout.read()).decode())


async def test_sigterm_finishes_every_accepted_request_and_exits_in_bounded_time() -> None:
    async with cost_server(40, 1, "--max-batch-size", "8") as (process, url, output):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            # 40 one-item requests at 8 per ~50 ms batch: about 250 ms of accepted work.
            futures = [
                asyncio.ensure_future(client.post("/", content=f"job{i}".encode()))
                for i in range(40)
            ]
            for _ in range(500):
                metrics = (await client.get("/metrics")).text
                ran = sample(metrics, "batching_batch_size_items_count", 0.0, model="CostModel")
                if ran and sample(metrics, "batching_queue_depth_items", model="CostModel") >= 16:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the queue never held 16 items behind a running batch")
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            responses = await asyncio.gather(*futures, return_exceptions=True)
        statuses = [getattr(response, "status_code", repr(response)) for response in responses]
        # Every accepted request is answered: served, or told to retry; none hangs or is lost.
        assert all(status in (200, 503) for status in statuses), statuses
        assert statuses.count(200) >= 16
        for index, response in enumerate(responses):
            if isinstance(response, httpx.Response) and response.status_code == 200:
                assert response.json()["outputs"][0]["input"] == f"job{index}"
        returncode = await asyncio.wait_for(process.wait(), 25)
        assert time.monotonic() - signalled < 25
        assert returncode in (0, -signal.SIGTERM)
    assert "Traceback" not in output[0], output[0]


async def test_during_the_drain_readiness_answers_503_until_the_listener_closes() -> None:
    # One batch takes 1.5 s: the drain lasts as long as it runs.
    async with cost_server(1500, 0, "--grpc-port", "0") as (process, url, output):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            accepted = asyncio.ensure_future(client.post("/", content=b"accepted"))
            for _ in range(500):
                metrics = (await client.get("/metrics")).text
                if sample(metrics, "batching_inflight_items", 0.0, model="CostModel") >= 1:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the accepted request never started running")
            process.send_signal(signal.SIGTERM)
            # Probes on fresh connections, as a load balancer's: 200 until the signal is
            # handled, then 503 with a JSON body; never a refused connection while the
            # accepted request runs.
            probes: list[int] = []
            async with httpx.AsyncClient(base_url=url, timeout=5) as prober:
                while not accepted.done():
                    probe = await prober.get("/v2/health/ready", headers={"connection": "close"})
                    probes.append(probe.status_code)
                    if probe.status_code == 503:
                        assert probe.json() == {"ready": False}
                        refused = await prober.post("/", content=b"new work")
                        assert refused.status_code == 503
                        assert "shutting down" in refused.json()["error"]
                        break
                    await asyncio.sleep(0.01)
            answered = await accepted
        assert probes and probes[-1] == 503 and set(probes) <= {200, 503}, probes
        assert answered.status_code == 200 and answered.json()["outputs"][0]["input"] == "accepted"
        assert await asyncio.wait_for(process.wait(), 25) in (0, -signal.SIGTERM)
    assert "Traceback" not in output[0], output[0]
    assert "draining: not ready" in output[0]


async def test_ctrl_c_stops_the_server_without_a_traceback() -> None:
    """SIGINT (Ctrl-C in a terminal) drains like SIGTERM and exits 130, as a process stopped
    by SIGINT does, with no traceback in its output."""
    async with cost_server(1, 1, "--grpc-port", "0") as (process, _url, output):
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), timeout=30)
    assert code == 128 + signal.SIGINT
    assert "Traceback" not in output[0] and "KeyboardInterrupt" not in output[0]
