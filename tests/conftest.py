from __future__ import annotations

import os

# Nothing may reach a model hub: tests build their models locally or use the packaged one.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    # The server is built on asyncio futures and asyncio.timeout; trio is not a target.
    return "asyncio"
