from __future__ import annotations

import os

# Nothing may reach a model hub: tests build their models locally or use the packaged one.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# One engine cache for the whole session (server.py subprocesses inherit it): the default model
# is exported and measured by the first test that serves it with --engine auto, and every
# later one reuses that, as a restarted server would. A fresh folder, so each run measures once.
if "BATCHING_ENGINE_CACHE" not in os.environ:
    _ENGINE_CACHE = tempfile.mkdtemp(prefix="batching-test-engines-")
    os.environ["BATCHING_ENGINE_CACHE"] = _ENGINE_CACHE
    atexit.register(shutil.rmtree, _ENGINE_CACHE, True)


@pytest.fixture
def anyio_backend() -> str:
    # The server is built on asyncio futures and asyncio.timeout; trio is not a target.
    return "asyncio"
