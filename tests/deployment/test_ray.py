"""Ray Serve (``batching.ray:build_app``): two replicas behind Ray's proxy on a local 2-CPU
Ray cluster both serve, and every answer equals the plain server's.

Needs ``pip install -e ".[ray]"``: without it this test fails with that instruction, it
never skips.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.asgi import serving
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tests.support.ray_models:RecordingModel"


def ray_adapter() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Ray's own pydantic deprecations, at import
            import batching.ray
    except ImportError as exc:
        raise AssertionError('Ray is not installed: pip install -e ".[ray]"') from exc
    return batching.ray


def test_build_app_arguments_become_server_flags() -> None:
    adapter = ray_adapter()
    argv = adapter.server_argv(
        {"model": MODEL, "max_batch_size": "8", "max-queue-delay-ms": "3", "replicas": "2"}
    )
    assert argv == ["--model", MODEL, "--max-batch-size", "8", "--max-queue-delay-ms", "3"]
    with pytest.raises(ValueError, match="invalid batching options"):
        adapter.build_app({"max_batch_size": "many"})


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[tuple[Any, str, Path]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray
            from ray import serve
    except ImportError as exc:
        raise AssertionError('Ray is not installed: pip install -e ".[ray]"') from exc
    ray_adapter()
    records = tmp_path / "records"
    records.mkdir()
    port = free_port()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RECORD_DIR": str(records)}},
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield serve, f"http://127.0.0.1:{port}", records
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_two_replicas_behind_rays_proxy_both_serve_and_answer_as_the_plain_server(
    ray_cluster: tuple[Any, str, Path],
) -> None:
    serve, url, records = ray_cluster
    app = ray_adapter().build_app(
        {"model": MODEL, "replicas": "2", "num_cpus": "0.5", "max_batch_size": "8"}
    )
    serve.run(app, name="batching", route_prefix="/")
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(300)]

    async def through_ray() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            gate = asyncio.Semaphore(16)

            async def one(text: str) -> dict[str, Any]:
                async with gate:
                    response = await client.post("/", content=text.encode())
                assert response.status_code == 200, response.text
                body: dict[str, Any] = response.json()
                return body

            return list(await asyncio.gather(*(one(text) for text in texts)))

    async def plain() -> list[dict[str, Any]]:
        config = ModelConfig(
            name="RecordingModel", source=MODEL, batching=BatchingConfig(max_batch_size=8)
        )
        async with serving(create_app(config)) as client:
            return [(await client.post("/", content=text.encode())).json() for text in texts]

    served = asyncio.run(through_ray())
    expected = asyncio.run(plain())
    assert served == expected
    counts = {
        path.name: sum(int(line) for line in path.read_text().split()) for path in records.iterdir()
    }
    assert len(counts) == 2, counts  # two replica processes ran batches
    assert all(items > 0 for items in counts.values()), counts
    assert sum(counts.values()) == 300
    assert str(os.getpid()) not in counts
