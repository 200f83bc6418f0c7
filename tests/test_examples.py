"""Every example under examples/ (each Python snippet of the docs, included into its page) runs
as written against a real server: ``python server.py`` for the clients (openai SDK, tritonclient
over HTTP and gRPC, API keys, model control), a served GPT-2 for streaming, and uvicorn for the
apps (FastAPI host, tracing). The custom model class, examples/mypackage, is served by
tests/models/test_custom_model.py; the load test's commands by tests/test_docs_commands.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import generators
from tests.support.otlp import HttpReceiver
from tests.support.server_process import ROOT, ServerProcess
from tests.support.servers import free_port

EXAMPLES = ROOT / "examples"
#: The examples that are clients of the default model, and a line each must print.
CLIENTS = {
    "triton_http.py": "(2, 384)",
    "triton_grpc.py": "(2, 384)",
    "openai_embeddings.py": "2 384",
    "openai_embedding_options.py": "False Usage(prompt_tokens=8, total_tokens=8)",
    "triton_grpc_options.py": "uint8 4",
    "triton_grpc_tokens.py": "(8, 384) [(4, 384), (4, 384)]",
}
#: The Python blocks of the docs: each one includes a file of examples/.
SNIPPET = re.compile(r'```python\n--8<-- "(examples/[\w/]+\.py)"\n```')


def run(example: str, server: ServerProcess | None = None, **env: str) -> str:
    where = (
        {}
        if server is None
        else {
            "SERVER_URL": f"http://127.0.0.1:{server.port}",
            "GRPC_URL": f"127.0.0.1:{server.grpc_port}",
        }
    )
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        cwd=ROOT,
        env={**os.environ, **where, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{example}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_python_block_of_the_docs_is_an_example_file_and_every_example_is_shown() -> None:
    included: set[str] = set()
    for page in (ROOT / "docs").rglob("*.md"):
        text = page.read_text()
        blocks = re.findall(r"```python\n.*?```", text, re.S)
        snippets = SNIPPET.findall(text)
        assert len(blocks) == len(snippets), f"{page}: a Python block that is not an example"
        for name in snippets:
            assert (ROOT / name).is_file(), f"{page}: {name} does not exist"
        included.update(snippets)
    # The README (read where the site is not) shows its example's text as it is.
    readme = (ROOT / "README.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", readme, re.S):
        shown = [p for p in EXAMPLES.rglob("*.py") if p.read_text() == block]
        assert shown, f"a Python block of the README is no file of examples/:\n{block}"
        included.add(str(shown[0].relative_to(ROOT)))
    every = {str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*.py") if p.name != "__init__.py"}
    assert every == included


@pytest.fixture(scope="module")
def default_server() -> Iterator[ServerProcess]:
    server = ServerProcess(model=[], ready_s=300)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(CLIENTS))
def test_each_client_example_runs_against_the_default_model(
    example: str, default_server: ServerProcess
) -> None:
    printed = run(example, default_server)
    assert CLIENTS[example] in printed, printed


@pytest.mark.slow
def test_the_streaming_example_prints_a_streamed_completion(tmp_path: Path) -> None:
    folder = generators.gpt2_folder(tmp_path, "my-gpt2")
    model = ["--model", str(folder), "--task", "text-generation", "--name", "my-gpt2"]
    server = ServerProcess(model=model, ready_s=120)
    try:
        printed = run("openai_streaming.py", server, MODEL="my-gpt2")
    finally:
        server.stop()
    assert printed.strip(), "no text was streamed"


@pytest.mark.slow
def test_the_api_key_example_calls_every_door_with_its_key() -> None:
    server = ServerProcess("--api-key", "sk-first", model=[], ready_s=300)
    try:
        # Without the key the same calls are refused: the example's key is what opens them.
        refused = httpx.post(f"http://127.0.0.1:{server.port}/", content=b"hi", timeout=10)
        assert refused.status_code == 401
        printed = run("api_keys.py", server, API_KEY="sk-first")
    finally:
        server.stop()
    assert printed.splitlines() == ["1", "(1, 384)", "(1, 384)"]


@pytest.mark.slow
def test_the_model_control_example_loads_the_model_again(tmp_path: Path) -> None:
    repository = tmp_path / "models.toml"
    repository.write_text(
        '[models.sentiment]\nsource = "tests.support.models:EchoModel"\nversion = "2"\n'
    )
    flags = ["--model-control-mode", "explicit", "--admin-api-key", "sk-admin"]
    server = ServerProcess(*flags, model=["--model-repository", str(repository)])
    try:
        printed = run("model_control.py", server, MODEL="sentiment", ADMIN_KEY="sk-admin")
        server.wait_for("sentiment")
    finally:
        server.stop()
    assert printed.strip() == "['2']"


class App:
    """``uvicorn examples.NAME:app`` on a free port; its log lines, read as they come."""

    def __init__(self, target: str, **env: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", target, "--port", str(self.port)],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<exited>")
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 300) -> None:
        def seen() -> bool:
            assert "<exited>" not in self.lines, "".join(self.lines[-20:])
            return any(text in line for line in self.lines)

        with self._changed:
            assert self._changed.wait_for(seen, timeout), "".join(self.lines[-20:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self._reader.join(10)
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.mark.slow
def test_the_fastapi_host_serves_the_mounted_app() -> None:
    app = App("examples.fastapi_host:app")
    try:
        app.wait_for("ready: serving minilm")
        answer = httpx.post(f"http://127.0.0.1:{app.port}/ml/models/minilm", content=b"hi")
    finally:
        app.stop()
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["outputs"][0]) == 384


@pytest.mark.slow
def test_the_tracing_app_sends_its_request_spans_to_the_collector() -> None:
    with HttpReceiver() as collector:
        app = App(
            "examples.tracing_app:app", OTLP_ENDPOINT=collector.url.removesuffix("/v1/traces")
        )
        try:
            app.wait_for("Application startup complete")
            with httpx.Client(base_url=f"http://127.0.0.1:{app.port}", timeout=60) as client:
                assert client.get("/v2/health/live").status_code == 200
                # The example keeps half of the new traces: 20 requests leave one kept but
                # once in a million runs.
                for _ in range(20):
                    client.get("/v2/health/live")
        finally:
            app.stop()  # the app flushes its spans as it stops
        assert collector.spans
