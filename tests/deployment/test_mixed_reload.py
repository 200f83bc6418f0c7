"""A model reloaded and unloaded while the server's other models are busy: one takes
embeddings from several clients, another streams completions, over TLS with an API key. The
reload (a swap) and the unload lose no request of any model and leave no gap in the others'
readiness; the reloaded model answers throughout its reload. Real server, real clients
(httpx, the openai SDK, tritonclient)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import tritonclient.http as triton_http

from tests.support.repositories import mixed_repository
from tests.support.server_process import ServerProcess
from tests.support.tls import Pki, make_pki

pytestmark = pytest.mark.slow

KEY = "mixed-reload-key"
ADMIN = "mixed-reload-admin-key"
MODELS = ("embedder", "writer", "tagger")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    repository = mixed_repository(tmp_path_factory.mktemp("reload"), MODELS)
    flags = [
        *("--model-control-mode", "explicit", "--api-key", KEY, "--admin-api-key", ADMIN),
        *("--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key)),
    ]
    process = ServerProcess(*flags, model=["--model-repository", str(repository)], ready_s=110)
    yield process
    process.stop()


class Load:
    """A loop in a thread of its own until stopped: each round's outcome is kept, and the
    first round sets ``started``."""

    def __init__(self, name: str, one: Callable[[], str]) -> None:
        self.name = name
        self.one = one
        self.outcomes: list[str] = []
        self.started = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.outcomes.append(self.one())
            except Exception as exc:  # a failed round is an outcome to report
                self.outcomes.append(f"{type(exc).__name__}: {exc}")
            self.started.set()


def test_a_reload_and_an_unload_beside_busy_models_lose_nothing(
    server: ServerProcess, pki: Pki
) -> None:
    context = pki.client_context()
    headers = {"Authorization": f"Bearer {KEY}"}
    pooled = httpx.Client(base_url=server.url, verify=context, headers=headers, timeout=60)
    sdk_http = httpx.Client(verify=context, timeout=60)
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, http_client=sdk_http)

    def embed() -> str:
        answer = pooled.post("/v1/embeddings", json={"model": "embedder", "input": "a cat"})
        return "ok" if answer.status_code == 200 else f"{answer.status_code}: {answer.text}"

    def stream() -> str:
        chunks = list(
            sdk.completions.create(model="writer", prompt="the cat", max_tokens=6, stream=True)
        )
        finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        return "ok" if finished else f"no finish in {len(chunks)} chunks"

    def tag() -> str:
        answer = pooled.post("/models/tagger", content="the cat sat")
        return "ok" if answer.status_code == 200 else f"{answer.status_code}: {answer.text}"

    def ready() -> str:
        codes = [
            pooled.get(path).status_code
            for path in ("/v2/models/embedder/ready", "/v2/models/writer/ready", "/v2/health/ready")
        ]
        return "ok" if codes == [200, 200, 200] else f"not ready: {codes}"

    loads = [Load("embed", embed), Load("embed-2", embed), Load("stream", stream)]
    loads += [Load("ready", ready)]
    tagger = Load("tag", tag)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    client = triton_http.InferenceServerClient(
        server.url.removeprefix("https://"), ssl=True, ssl_options={"ca_certs": str(pki.ca)}
    )
    try:
        for load in [*loads, tagger]:
            load.thread.start()
        for load in [*loads, tagger]:
            assert load.started.wait(60), load.name
        # A reload with a new configuration (a swap), and another back to the file's.
        client.load_model("tagger", config='{"max_batch_size": 4}', headers=admin)
        client.load_model("tagger", headers=admin)
        tagger.stop.set()
        tagger.thread.join(60)
        client.unload_model("tagger", headers=admin)
        index: Any = client.get_model_repository_index(headers=headers)
        assert {entry["name"]: entry["state"] for entry in index}["tagger"] == "UNAVAILABLE"
        client.load_model("tagger", headers=admin)
        assert tag() == "ok"
    finally:
        for load in [*loads, tagger]:
            load.stop.set()
        for load in [*loads, tagger]:
            load.thread.join(60)
        client.close()
        pooled.close()
        sdk_http.close()
    for load in [*loads, tagger]:
        failed = [outcome for outcome in load.outcomes if outcome != "ok"]
        assert not failed, (load.name, failed[:5])
        assert len(load.outcomes) >= 2, load.name
