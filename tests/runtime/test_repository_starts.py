"""A repository of models of different tasks starts every time: each model loads on a thread
of its own, and the libraries' lazy imports are not safe side by side (transformers' lazy
module handed one thread a half-imported module: ``no attribute 'AutoModel'``), so loads are
ordered (:mod:`batching.models.loading`). Each start is a fresh interpreter, as a server's
first start is: nothing imported before."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.repositories import mixed_repository
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FOUR = ("embedder", "writer", "tagger", "vision")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_repository(tmp_path_factory.mktemp("four"), FOUR)


def start_until_ready(repository: Path) -> list[str]:
    """Start ``server.py`` on ``repository`` in a fresh interpreter; its log up to the ready
    line or its exit; the process is stopped before this returns."""
    process = subprocess.Popen(
        [
            sys.executable,
            "server.py",
            "--model-repository",
            str(repository),
            "--port",
            str(free_port()),
            "--grpc-port",
            str(free_port()),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 100
        for line in process.stderr:  # ends when the process exits
            lines.append(line.rstrip("\n"))
            if "ready: serving" in line or time.monotonic() > deadline:
                break
    finally:
        process.terminate()
        process.wait(30)
        if process.stderr is not None:
            process.stderr.close()
    return lines


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
