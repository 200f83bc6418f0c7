"""What ``python server.py`` prints while it starts: a line as each model instance starts
loading, one when it is loaded and warms up, one when it is warm, and a last one that says
it is ready and where; in text and in JSON (ISO 8601 times with milliseconds). A real
server process; thread and process instances."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from tests.support.server_log import READY, log_until_ready
from tests.support.servers import free_port

pytestmark = pytest.mark.slow


def start_and_read_until_ready(*flags: str) -> tuple[list[str], int, int]:
    """Start the server, return its log lines up to and including the ready line, its HTTP
    port and its gRPC port; the server is stopped before this returns."""
    port, grpc_port = free_port(), free_port()
    lines = log_until_ready(
        "--model",
        "tests.support.models:EchoModel",
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        *flags,
        budget_s=90,
    )
    assert any(READY in line for line in lines), "\n".join(lines)
    return lines, port, grpc_port


def position(lines: list[str], pattern: str) -> int:
    for index, line in enumerate(lines):
        if re.search(pattern, line):
            return index
    raise AssertionError(f"no line matches {pattern!r}:\n" + "\n".join(lines))


def test_start_up_says_what_it_loads_and_when_it_is_ready_and_where() -> None:
    lines, port, grpc_port = start_and_read_until_ready()
    loading = position(lines, r"loading model EchoModel on cpu \(instance 1/1\)\.\.\.$")
    loaded = position(lines, r"instance EchoModel-0 loaded in \d+\.\d s; warming up \(0 batches\)")
    warm = position(lines, r"model EchoModel instance 0 warm in \d+\.\d s, ready on cpu")
    ready = position(lines, "ready: serving")
    assert loading < loaded < warm < ready == len(lines) - 1
    url = f"http://127.0.0.1:{port}"
    assert lines[ready].endswith(
        f"ready: serving EchoModel at {url} (v2 at {url}/v2, gRPC at 127.0.0.1:{grpc_port})"
    )


def test_json_logs_carry_millisecond_times_and_process_instances_report_progress() -> None:
    lines, port, _ = start_and_read_until_ready(
        "--log-format", "json", "--instance-kind", "process"
    )
    documents = [json.loads(line) for line in lines]  # every line is one JSON object
    for document in documents:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", document["time"])
    times = [dt.datetime.fromisoformat(document["time"]) for document in documents]
    assert times == sorted(times)
    messages = [document["message"] for document in documents]
    # The child process says when its model is loaded, through the parent's log.
    loaded = position(messages, r"instance EchoModel-0 loaded in .*warming up")
    assert loaded < position(messages, "warm in") < position(messages, "ready: serving")
    assert f"at http://127.0.0.1:{port} " in messages[-1]
