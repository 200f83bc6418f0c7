"""Triton's perf_analyzer, unmodified, against a real server: it reads the model's metadata and
configuration, sends binary or JSON tensors, and reads the statistics extension, whose
queue/compute split it prints under "Server:".

The binary comes from ``scripts/install-perf-analyzer.sh`` (docs/perf-analyzer.md); a missing
binary fails these tests, naming the script, instead of skipping them.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
from pathlib import Path

import pytest

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.servers import free_port, running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: The wrapper that puts the binary's libcudart on LD_LIBRARY_PATH.
WRAPPER = ROOT / "scripts" / "perf_analyzer"
VENV = Path(os.environ.get("PERF_ANALYZER_VENV", ROOT / ".venv-pa"))

MODEL = ModelConfig(
    name="vectors",
    source="tests.support.models:VectorModel",
    batching=BatchingConfig(max_batch_size=8),
)

#: A short measurement: half-second windows, stable enough at 100% (this checks that it runs
#: and what it reports, not how fast anything is).
SHORT = ["--measurement-interval", "500", "-s", "100", "-r", "10"]

HAS_GRPC_DOOR = "grpc_port" in inspect.signature(create_app).parameters


def require_perf_analyzer() -> None:
    if not (VENV / "bin" / "perf_analyzer").exists():
        pytest.fail(
            f"perf_analyzer is not installed in {VENV}: run "
            "`bash scripts/install-perf-analyzer.sh` (see docs/perf-analyzer.md)",
            pytrace=False,
        )


async def perf_analyzer(*args: str) -> tuple[int, str]:
    """Run perf_analyzer with ``args``; its exit status and everything it printed."""
    require_perf_analyzer()
    process = await asyncio.create_subprocess_exec(
        str(WRAPPER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PERF_ANALYZER_VENV": str(VENV)},
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=90)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


def assert_measured(code: int, output: str) -> None:
    """Exit 0, a positive client throughput, and the server-side line the statistics give."""
    assert code == 0, output
    throughput = re.search(r"Throughput: ([0-9.]+) infer/sec", output)
    assert throughput is not None, output
    assert float(throughput.group(1)) > 0, output
    assert "Server:" in output, output
    inferences = re.search(r"Inference count: (\d+)", output)
    assert inferences is not None and int(inferences.group(1)) > 0, output
    latency = re.search(
        r"Avg request latency: (\d+) usec \(overhead \d+ usec \+ queue \d+ usec \+ "
        r"compute input \d+ usec \+ compute infer \d+ usec \+ compute output \d+ usec\)",
        output,
    )
    assert latency is not None, output


@pytest.mark.parametrize(
    "tensor_format",
    [
        pytest.param([], id="binary"),
        pytest.param(
            ["--input-tensor-format", "json", "--output-tensor-format", "json"], id="json"
        ),
    ],
)
async def test_perf_analyzer_over_http(tensor_format: list[str]) -> None:
    require_perf_analyzer()
    async with running(create_app(MODEL)) as url:
        code, output = await perf_analyzer(
            "-m",
            "vectors",
            "-u",
            url.removeprefix("http://"),
            "-i",
            "http",
            *tensor_format,
            "--string-data",
            "the quick brown fox",
            "-b",
            "2",
            "--concurrency-range",
            "4:4",
            *SHORT,
        )
    assert_measured(code, output)


@pytest.mark.skipif(
    not HAS_GRPC_DOOR, reason="the gRPC door (create_app(..., grpc_port=...)) has not landed"
)
async def test_perf_analyzer_over_grpc() -> None:
    require_perf_analyzer()
    port = free_port()
    async with running(create_app(MODEL, grpc_port=port)):
        code, output = await perf_analyzer(
            "-m",
            "vectors",
            "-u",
            f"127.0.0.1:{port}",
            "-i",
            "grpc",
            "--string-data",
            "the quick brown fox",
            "-b",
            "2",
            "--concurrency-range",
            "4:4",
            *SHORT,
        )
    assert_measured(code, output)
