"""Warm-up proves every task: a task's model runs inputs of its own kind (and the server-wide
parameters) before it reports ready, and one that cannot never reports ready."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from batching import ModelConfig, create_app
from batching.models.parameters import TaskItem
from batching.runtime.deployment import Deployment
from tests.support.asgi import serving
from tests.support.tiny import encoder_folder, masked_folder

pytestmark = pytest.mark.anyio


class Silent:
    """A task's model that makes no warm-up input; it would answer anything."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def load(self, device: str) -> None:
        pass

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.seen.extend(inputs)
        return ["ok" for _ in inputs]


class Warm(Silent):
    def warmup_inputs(self, max_batch_size: int) -> list[list[Any]]:
        return [["warm"]]


async def failure_of(config: ModelConfig, model: Any = None) -> tuple[str, bool]:
    """The load failure of ``config`` served alone, and whether it was ever ready."""
    failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_failure(deployment: Deployment, index: int, reason: str) -> None:
        if not failed.done():
            failed.set_result(reason)

    kwargs: dict[str, Any] = {"on_load_failure": on_failure}
    if model is not None:
        kwargs["builder"] = lambda _: model
    app = create_app(config, **kwargs)
    async with serving(app, wait_ready=False) as client:
        reason = await asyncio.wait_for(failed, 60)
        ready = (await client.get("/v2/health/ready")).status_code == 200
    return reason, ready


async def test_a_task_model_without_warm_up_inputs_never_reports_ready(tmp_path: Path) -> None:
    config = ModelConfig(name="m", source=str(encoder_folder(tmp_path)), task="text-classification")
    reason, ready = await failure_of(config, Silent())
    assert "made no warm-up batch" in reason and not ready


async def test_a_task_model_warms_up_with_the_server_wide_parameters(tmp_path: Path) -> None:
    config = ModelConfig(
        name="m",
        source=str(encoder_folder(tmp_path)),
        task="token-classification",
        parameters=(("aggregation_strategy", "simple"),),
    )
    model = Warm()
    async with serving(create_app(config, builder=lambda _: model)):
        pass
    assert model.seen == ["warm", TaskItem("warm", (("aggregation_strategy", "simple"),))]


async def test_defaults_the_model_cannot_apply_stop_it_before_ready(tmp_path: Path) -> None:
    # " " passes the declaration (a list of strings) but the tokenizer makes no word of it.
    config = ModelConfig(
        name="mlm",
        source=str(masked_folder(tmp_path)),
        task="fill-mask",
        engine="torch",
        precision="fp32",
        parameters=(("targets", (" ",)),),
    )
    reason, ready = await failure_of(config)
    assert "'targets'" in reason and not ready
