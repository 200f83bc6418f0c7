"""API keys against a real ``python server.py`` on 127.0.0.1, with the clients users run: curl,
tritonclient over HTTP and gRPC (``headers=``), and the ``openai`` SDK (``api_key=``). One server
for the module: keys from ``--api-key`` and from a key file laid out as kubelet mounts a Secret,
and ``/metrics`` on its own port.

Each refusal is checked to cost no model time: the batch counters (read on the metrics port)
stay where they were. The key file's rotation is checked to take effect without a restart.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.support.metrics import sample
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FLAG_KEY = "sk-flag-4f1d9c2e7a"
FILE_KEY = "sk-file-first-8b3e"
ROTATED_KEY = "sk-file-second-a7c1"
WRONG = "sk-wrong-0000"
MODEL = "VectorModel"


class Server:
    def __init__(self, url: str, grpc_target: str, metrics_url: str, secret: Path) -> None:
        self.url = url
        self.grpc = grpc_target
        self.metrics_url = metrics_url
        self.secret = secret

    def metrics(self) -> str:
        return httpx.get(f"{self.metrics_url}/metrics", timeout=10).text

    def batches(self) -> float:
        return sample(self.metrics(), "batching_batch_size_items_count", 0.0, model=MODEL)

    def refused(self, door: str) -> float:
        return sample(self.metrics(), "batching_unauthorized_total", door=door)

    def rotate(self, keys: str, stamp: str) -> None:
        """What kubelet does when the Secret changes: a new timestamped folder, then the
        ``..data`` link swapped to it atomically."""
        folder = self.secret / stamp
        folder.mkdir()
        (folder / "keys").write_text(keys)
        (self.secret / "..data_tmp").symlink_to(stamp)
        os.replace(self.secret / "..data_tmp", self.secret / "..data")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    secret = tmp_path_factory.mktemp("secret")
    (secret / "..2026_01_01").mkdir()
    (secret / "..2026_01_01" / "keys").write_text(FILE_KEY + "\n")
    (secret / "..data").symlink_to("..2026_01_01")
    (secret / "keys").symlink_to("..data/keys")
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "server.py", "--model", f"tests.support.models:{MODEL}"],
        cwd=ROOT,
        env={
            **os.environ,
            "BATCHING_PORT": str(port),
            "BATCHING_GRPC_PORT": str(grpc_port),
            "BATCHING_METRICS_PORT": str(metrics_port),
            "BATCHING_API_KEY": FLAG_KEY,
            "BATCHING_API_KEY_FILE": str(secret / "keys"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the server never became ready")
            time.sleep(0.02)  # polling a probe, as an orchestrator does
        yield Server(url, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}", secret)
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
        log = output.decode()
        # No key is ever logged.
        for key in (FLAG_KEY, FILE_KEY, ROTATED_KEY, WRONG):
            assert key not in log


def curl(*args: str) -> tuple[int, dict[str, str], str]:
    done = subprocess.run(
        ["curl", "-s", "-i", "--max-time", "10", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    status_line, *lines = head.splitlines()
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines)
    }
    return int(status_line.split()[1]), headers, body


INFER_BODY = json.dumps(
    {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
)


def test_curl_needs_a_key_and_gets_401_with_the_bearer_challenge(server: Server) -> None:
    before = server.batches()
    infer = f"{server.url}/v2/models/{MODEL}/infer"
    status, headers, body = curl("-d", INFER_BODY, infer)
    assert status == 401
    assert headers["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"].startswith("a valid API key is required")
    status, headers, body = curl("-H", f"Authorization: Bearer {WRONG}", "-d", INFER_BODY, infer)
    assert status == 401 and headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert WRONG not in body
    assert server.batches() == before  # no model time
    status, _, body = curl("-H", f"Authorization: Bearer {FLAG_KEY}", "-d", INFER_BODY, infer)
    assert status == 200, body
    status, _, _ = curl("-H", f"api-key: {FILE_KEY}", "-d", INFER_BODY, infer)
    assert status == 200
    assert server.batches() > before


def test_the_probes_stay_open_and_metrics_has_its_own_port(server: Server) -> None:
    assert curl(f"{server.url}/v2/health/live")[0] == 200
    assert curl(f"{server.url}/v2/health/ready")[0] == 200
    assert curl(f"{server.metrics_url}/metrics")[0] == 200
    assert curl(f"{server.metrics_url}/v2/health/ready")[0] == 200
    # Not on the main port, even with a key; nothing else on the metrics port.
    assert curl("-H", f"api-key: {FLAG_KEY}", f"{server.url}/metrics")[0] == 404
    assert curl("-H", f"api-key: {FLAG_KEY}", f"{server.metrics_url}/v2")[0] == 404
    # The model's description needs a key as its inference does.
    assert curl(f"{server.url}/v2/models/{MODEL}")[0] == 401
    assert curl(f"{server.url}/v2")[0] == 401


def test_a_host_header_cannot_make_a_keyed_path_look_open(server: Server) -> None:
    before = server.batches()
    status, _, _ = curl(
        "-H",
        "Host: localhost/v2/health/live?",
        "-d",
        INFER_BODY,
        f"{server.url}/v2/models/{MODEL}/infer",
    )
    assert status == 401
    assert server.batches() == before


def text_input(module: object) -> object:
    tensor = module.InferInput("text", [1], "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array(["hello"], dtype=object))
    return tensor


def test_tritonclient_http_sends_the_key_in_its_headers(server: Server) -> None:
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        before, refused = server.batches(), server.refused("http")
        with pytest.raises(InferenceServerException) as missing:
            client.infer(MODEL, [text_input(triton_http)])
        assert missing.value.status() == "401"
        with pytest.raises(InferenceServerException):
            client.get_model_metadata(MODEL, headers={"authorization": f"Bearer {WRONG}"})
        assert client.is_server_live()  # the probes need no key
        assert server.batches() == before
        assert server.refused("http") == refused + 2
        headers = {"authorization": f"Bearer {FILE_KEY}"}
        assert client.get_model_metadata(MODEL, headers=headers)["name"] == MODEL
        result = client.infer(MODEL, [text_input(triton_http)], headers=headers)
        assert result.as_numpy("embedding").tolist() == [[5.0, 104.0, 1.0, -1.0]]
    finally:
        client.close()


def test_tritonclient_grpc_gets_unauthenticated_without_the_key(server: Server) -> None:
    client = triton_grpc.InferenceServerClient(server.grpc)
    try:
        before, refused = server.batches(), server.refused("grpc")
        with pytest.raises(InferenceServerException) as missing:
            client.infer(MODEL, [text_input(triton_grpc)])
        assert missing.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as wrong:
            client.get_model_metadata(MODEL, headers={"authorization": f"Bearer {WRONG}"})
        assert wrong.value.status() == "StatusCode.UNAUTHENTICATED"
        assert WRONG not in str(wrong.value)
        assert client.is_server_live() and client.is_server_ready()
        assert server.batches() == before
        assert server.refused("grpc") == refused + 2
        headers = {"authorization": f"Bearer {FLAG_KEY}"}
        assert client.get_model_metadata(MODEL, headers=headers).name == MODEL
        result = client.infer(MODEL, [text_input(triton_grpc)], headers=headers)
        assert result.as_numpy("embedding").tolist() == [[5.0, 104.0, 1.0, -1.0]]
    finally:
        client.close()


def test_the_openai_sdk_gets_invalid_api_key_and_works_with_its_key(server: Server) -> None:
    before = server.batches()
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=WRONG, max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.embeddings.create(model=MODEL, input=["hello"])
        assert refused.value.status_code == 401
        assert refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    assert server.batches() == before
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=FILE_KEY, max_retries=0) as sdk:
        assert [model.id for model in sdk.models.list()] == [MODEL]
        answer = sdk.embeddings.create(model=MODEL, input=["hello"], encoding_format="float")
        assert len(answer.data[0].embedding) == 4


def test_rotating_the_key_file_takes_effect_without_a_restart(server: Server) -> None:
    """Last: it retires FILE_KEY for the module's server."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=ROTATED_KEY, max_retries=0) as new:
        with pytest.raises(openai.AuthenticationError):
            new.models.list()
        server.rotate(ROTATED_KEY + "\n", "..2026_01_02")
        # The server looks at the file at most once a second: poll as a client would.
        deadline = time.monotonic() + 15
        while True:
            try:
                new.models.list()
                break
            except openai.AuthenticationError:
                assert time.monotonic() < deadline, "the rotated key was never accepted"
                time.sleep(0.05)
    status, _, _ = curl("-H", f"Authorization: Bearer {FILE_KEY}", f"{server.url}/v2")
    assert status == 401  # the old file key is retired
    status, _, _ = curl("-H", f"Authorization: Bearer {FLAG_KEY}", f"{server.url}/v2")
    assert status == 200  # the flag's key is not the file's to retire
    assert curl(f"{server.url}/v2")[0] == 401


def start_failure(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "server.py", "--model", "tests.support.models:EchoModel", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    errors = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("server.py:") or " ERROR " in line or "running on" in line.lower()
    ]
    assert "Traceback" not in done.stderr
    return done.returncode, errors


def test_a_server_meant_to_be_locked_never_starts_open(tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("\n")
    port = str(free_port())
    code, errors = start_failure("--port", port, "--grpc-port", "0", "--api-key-file", str(empty))
    assert code == 2
    assert errors == [f"server.py: error: --api-key-file {empty}: holds no key (one key per line)"]
    code, errors = start_failure(
        "--port", port, "--grpc-port", "0", env={"BATCHING_API_KEY_FILE": str(tmp_path / "no")}
    )
    assert code == 2
    assert errors == [
        f"server.py: error: --api-key-file {tmp_path / 'no'}: cannot be read "
        "(No such file or directory)"
    ]


def test_a_taken_metrics_port_stops_the_start_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics_port = taken.getsockname()[1]
        code, errors = start_failure(
            "--port", str(free_port()), "--grpc-port", "0", "--metrics-port", str(metrics_port)
        )
    assert code == 1
    assert errors == [
        f"server.py: error: cannot serve metrics on 127.0.0.1:{metrics_port}: Address already "
        "in use (--metrics-port picks another port)"
    ]
