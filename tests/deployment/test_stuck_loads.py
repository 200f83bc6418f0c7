"""A model load that never returns never keeps ``python server.py`` alive: SIGTERM ends it,
and so does a failed start, with one line and no traceback (the instances' threads are
daemons, which the interpreter does not wait for at exit)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.support.servers import free_port
from tests.support.stuck import STUCK_LINE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Output:
    """A process's merged output, line by line, read on a thread of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"never printed {text!r}:\n{''.join(self.seen)}")
            self.seen.append(line)

    def rest(self) -> str:
        """Everything printed, once the process closed its output."""
        self.reader.join(30)
        assert not self.reader.is_alive(), "the output never closed"
        while (line := self.lines.get()) is not None:
            self.seen.append(line)
        return "".join(self.seen)


@contextlib.contextmanager
def server(*flags: str) -> Iterator[tuple[subprocess.Popen[str], Output, str]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "server.py", "--port", str(port), "--grpc-port", "0", *flags],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    try:
        yield process, Output(process.stdout), f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()


def wait_live(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=5) as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if client.get("/v2/health/live").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError("the server never answered /v2/health/live")
            time.sleep(0.02)  # polling a subprocess's listener, with a deadline


@pytest.mark.parametrize(
    ("signum", "codes"),
    [
        # uvicorn raises SIGTERM again once it has shut down: the process ends by it.
        (signal.SIGTERM, (0, -signal.SIGTERM)),
        # Ctrl-C: server.py exits 130 through the interpreter's own exit, which waited for
        # every instance thread when they were not daemons.
        (signal.SIGINT, (128 + signal.SIGINT,)),
    ],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_ends_the_server_while_a_model_load_never_returns(
    signum: signal.Signals, codes: tuple[int, ...]
) -> None:
    with server("--model", "tests.support.stuck:StuckLoad", "--shutdown-timeout-s", "5") as (
        process,
        output,
        url,
    ):
        output.wait_for(STUCK_LINE)  # the load is under way on its thread, and stays there
        wait_live(url)
        process.send_signal(signum)
        code = process.wait(timeout=60)
        printed = output.rest()
    assert code in codes, printed
    assert "Finished server process" in printed
    assert "Traceback" not in printed, printed


def test_a_failed_start_ends_the_process_with_one_line_while_another_load_hangs(
    tmp_path: Path,
) -> None:
    # Models load one at a time, in the repository's order: "a-broken" fails, then
    # "b-stuck" takes its turn and never returns; the process must end all the same.
    for name, cls in (("a-broken", "Fails"), ("b-stuck", "StuckLoad")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(
            f'source = "tests.support.stuck:{cls}"\n', encoding="utf-8"
        )
    with server("--model-repository", str(tmp_path)) as (process, output, _):
        code = process.wait(timeout=60)
        printed = output.rest()
    assert code == 1, printed
    errors = [line for line in printed.splitlines() if line.startswith("server.py: error:")]
    assert errors == [printed.splitlines()[-1]], printed
    assert errors[0].startswith("server.py: error: model 'a-broken'")
    assert "cannot be loaded: OSError: model.safetensors is truncated" in errors[0]
    assert "Traceback" not in printed, printed
