"""A new user's first load test: without the ``[loadtest]`` extra, against a server that is not
running, from a directory other than the clone, and with a server that does not start; each
ends in one line that says what to do, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from load_test.__main__ import main
from tests.loadtest.helpers import ROOT
from tests.support.servers import free_port

MISSING_HTTPX = (
    "import runpy, sys; sys.modules['httpx'] = None; sys.argv = ['load_test', 'run']; "
    "runpy.run_module('load_test', run_name='__main__', alter_sys=True)"
)


def test_without_the_extra_the_tool_names_it_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MISSING_HTTPX],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (
        "python -m load_test: error: the load-testing tool needs the [loadtest] extra "
        '(httpx missing): run pip install -e ".[loadtest]" in the repository '
        '(or pip install "batching[loadtest]")'
    )


@pytest.mark.parametrize(
    "command",
    [
        ["run", "-d", "30"],
        ["run", "--rate", "100", "-d", "30"],
        ["concurrency-sweep"],
        ["soak", "-d", "30"],
    ],
)
def test_no_server_there_fails_fast_in_one_line(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    code = main([*command, "--url", url])
    assert time.monotonic() - started < 3
    assert code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"python -m load_test: error: no server answers at {url} (")
    assert line.endswith("start it with python server.py, or point --url at a running one")


def test_a_grpc_run_checks_the_grpc_door_too(capsys: pytest.CaptureFixture[str]) -> None:
    grpc_port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(http_port := free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as listener:
        try:
            deadline = time.monotonic() + 30
            while True:  # polling a subprocess until it listens, with a deadline
                try:
                    import socket

                    socket.create_connection(("127.0.0.1", http_port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            code = main(
                ["run", "--url", f"http://127.0.0.1:{http_port}", "--api", "grpc"]
                + ["--grpc-url", f"127.0.0.1:{grpc_port}", "-d", "30"]
            )
        finally:
            listener.terminate()
    assert code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert f"no server answers at gRPC 127.0.0.1:{grpc_port}" in line


ECHO_MODULE = """
class Echo:
    def load(self, device):
        pass

    def predict(self, inputs):
        return [text for text in inputs]
"""


@pytest.mark.slow
def test_triton_batching_starts_the_server_from_any_directory(tmp_path: Path) -> None:
    # A user's own project folder, far from the clone: their model module lives there.
    (tmp_path / "my_models.py").write_text(ECHO_MODULE)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "load_test", "triton-batching", "--model", "my_models:Echo"]
        + ["--server-arg=--grpc-port=0", "--sizes", "1,2", "--requests", "16", "--clients", "2"]
        + ["--warmup", "2", "--no-progress", "--out-dir", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    doc = orjson.loads((tmp_path / "out" / "triton_batching.json").read_bytes())
    assert {(row["batching"], row["items_per_request"]) for row in doc["rows"]} == {
        ("off", 1),
        ("off", 2),
        ("on", 1),
        ("on", 2),
    }
    assert all(row["error_rate"] == 0 for row in doc["rows"])
    assert Path(ROOT / "server.py").is_file()


@pytest.mark.slow
def test_a_server_that_cannot_start_is_one_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["tune", "--p99-ms", "100", "--model", "no_such_module:Model", "--no-progress"]
        + ["--server-arg=--grpc-port=0", "--out-dir", str(tmp_path)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m load_test: error: server exited with 2 before it was ready")
    assert "cannot import module 'no_such_module'" in err
    assert "Traceback" not in err
