"""``benchmarks/served_cost.py``: what a served generation load cost per output token, read
from a real server on 127.0.0.1 (this process's, in a thread) and its ``/metrics``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batching import BatchingConfig, ModelConfig, create_app
from benchmarks.served_cost import cost, snapshot
from tests.support.generators import gpt2_folder
from tests.support.threaded import serving_in_thread


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder: Path = gpt2_folder(tmp_path_factory.mktemp("cost"))
    config = ModelConfig(
        name="gpt2",
        source=str(folder),
        task="text-generation",
        batching=BatchingConfig(max_batch_size=4, max_batch_tokens=400),
    )
    with serving_in_thread(create_app([config]), timeout=120) as url:
        yield url


def test_a_lone_completion_costs_a_decode_step_per_token_after_its_first(url: str) -> None:
    before = snapshot(url, os.getpid(), "gpt2")
    started = time.perf_counter()
    body = {"model": "gpt2", "prompt": "the cat", "max_tokens": 6}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    seconds = time.perf_counter() - started
    tokens = answer["usage"]["completion_tokens"]
    assert tokens >= 2
    figures = cost(before, snapshot(url, os.getpid(), "gpt2"), tokens, seconds)
    # The first token comes from the prompt's forward, each later one from a step of one row.
    assert figures["decode_steps"] == tokens - 1
    assert figures["sequences_per_step"] == 1.0
    assert 0 < figures["decode_step_ms"] < 1000 * seconds
    assert 0 < figures["steps_share_of_wall"] < 1
    # In this process the "event loop" thread is the test's (the server runs in another).
    assert figures["server_cpu_us_per_token"] > 0


def test_a_model_that_never_stepped_has_no_step_figures(url: str) -> None:
    now = snapshot(url, os.getpid(), "no-such-model")
    figures = cost(now, now, 0, 1.0)
    assert figures["decode_steps"] == 0
    assert figures["decode_step_ms"] is None and figures["sequences_per_step"] is None
