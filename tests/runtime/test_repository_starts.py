"""A repository of models of different tasks starts every time: each model loads on a thread
of its own, and the libraries' lazy imports are not safe side by side (transformers' lazy
module handed one thread a half-imported module: ``no attribute 'AutoModel'``), so loads are
ordered (:mod:`batching.models.loading`). Each start is a fresh interpreter, as a server's
first start is: nothing imported before."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.repositories import mixed_repository
from tests.support.server_log import log_until_ready
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

FOUR = ("embedder", "writer", "tagger", "vision")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_repository(tmp_path_factory.mktemp("four"), FOUR)


def start_until_ready(repository: Path) -> list[str]:
    """Start ``server.py`` on ``repository`` in a fresh interpreter; its log up to the ready
    line or its exit; the process is stopped before this returns."""
    return log_until_ready(
        "--model-repository",
        str(repository),
        "--port",
        str(free_port()),
        "--grpc-port",
        str(free_port()),
    )


@pytest.mark.parametrize("attempt", range(3))
def test_a_repository_of_four_tasks_starts_in_a_fresh_interpreter(
    repository: Path, attempt: int
) -> None:
    lines = start_until_ready(repository)
    log = "\n".join(lines)
    assert lines and "ready: serving" in lines[-1], log
    for name in FOUR:
        assert f"model {name} instance 0 warm in" in log, log
    assert "failed to load" not in log, log
