"""A request the batcher will refuse is refused before the door spends work on it: its texts'
tokens are not counted (a storm of refusals must cost the event loop as little as it can)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from batching.core.batcher import Batcher
from batching.model_config import BatchingConfig, ModelConfig
from tests.support.asgi import app_with, serving
from tests.support.embedder import OptionEmbedder

pytestmark = pytest.mark.anyio


class GatedCountingEmbedder(OptionEmbedder):
    """Counts the texts it is asked to tokenise; its batches wait for :attr:`gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.counted = 0

    def count_tokens(self, item: Any) -> int:
        self.counted += 1
        return super().count_tokens(item)

    def token_length(self, item: Any, limit: int) -> int:
        self.counted += 1
        return super().token_length(item, limit)

    def predict(self, inputs: list[Any]) -> list[Any]:
        self.entered.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("gate never opened")
        return list(super().predict(inputs))


async def test_a_refused_request_has_no_tokens_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # The second request is known to be queued once the batcher took it (its submit returned).
    submitted = 0
    two_queued = asyncio.Event()
    submit = Batcher.submit

    def counted_submit(self: Batcher, *args: Any, **kwargs: Any) -> Any:
        nonlocal submitted
        future = submit(self, *args, **kwargs)
        submitted += 1
        if submitted == 2:
            two_queued.set()
        return future

    monkeypatch.setattr(Batcher, "submit", counted_submit)
    model = GatedCountingEmbedder()
    config = ModelConfig(name="opts", batching=BatchingConfig(max_batch_size=1, max_queue_size=1))
    async with serving(app_with(model, config)) as client:
        running = asyncio.ensure_future(client.post("/models/opts", json={"inputs": ["a b"]}))
        await asyncio.to_thread(model.entered.wait, 30)
        queued = asyncio.ensure_future(client.post("/models/opts", json={"inputs": ["c d"]}))
        await asyncio.wait_for(two_queued.wait(), 30)  # the second is queued
        before = model.counted
        refused = await client.post("/models/opts", json={"inputs": ["e f"]})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]
        assert model.counted == before
        model.gate.set()
        assert (await running).status_code == 200
        assert (await queued).status_code == 200
