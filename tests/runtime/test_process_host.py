"""A generating model on a process instance (``instance_kind: process``): its running batch
lives and steps in a child process (:mod:`batching.runtime.process_host`). Served for real on
127.0.0.1 with keys on, read with the official ``openai`` SDK: streams answer as on a thread
instance, a client that goes away frees its row, and a child that dies fails what it ran and
is started again."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batching import BatchingConfig, ModelConfig, create_app
from batching.keys import ApiKeys
from tests.support.generators import (
    direct_seq2seq,
    gpt2_folder,
    greedy_text,
    t5_folder,
)
from tests.support.server_process import ServerProcess
from tests.support.threaded import serving_in_thread
from tests.support.tls import make_pki

KEY = "sk-process-key"
PROMPTS = ["the cat sat", "a dog", "who eats fish on the mat", "i like green"] * 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("process-host")
    return {"gpt2": gpt2_folder(root), "t5": t5_folder(root)}


@pytest.fixture(scope="module")
def url(folders: dict[str, Path]) -> Iterator[str]:
    configs = [
        ModelConfig(
            name="gpt2",
            source=str(folders["gpt2"]),
            task="text-generation",
            instance_kind="process",
            batching=BatchingConfig(max_batch_size=16, max_batch_tokens=2000),
        ),
        ModelConfig(
            name="t5",
            source=str(folders["t5"]),
            task="text2text-generation",
            instance_kind="process",
            batching=BatchingConfig(max_batch_size=4),
        ),
    ]
    with serving_in_thread(create_app(configs, api_keys=ApiKeys([KEY])), timeout=180) as url:
        yield url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def children(marker: str) -> list[psutil.Process]:
    """This process's children running ``marker``'s module (the model's child)."""
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if any(marker in part for part in child.cmdline())
    ]


def streamed(client: openai.OpenAI, prompt: str, tokens: int) -> str:
    stream = client.completions.create(
        model="gpt2", prompt=prompt, max_tokens=tokens, temperature=0, stream=True
    )
    return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


def test_the_model_runs_in_a_child_and_sixteen_streams_get_their_lone_answers(
    client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    assert len(children("process_host")) == 2  # one per model, neither in this process
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda prompt: streamed(client, prompt, 10), PROMPTS))
    alone = {prompt: greedy_text(folders["gpt2"], prompt, 10) for prompt in set(PROMPTS)}
    assert answers == [alone[prompt] for prompt in PROMPTS]
    whole = client.completions.create(model="gpt2", prompt=PROMPTS[2], max_tokens=7)
    assert whole.choices[0].text == greedy_text(folders["gpt2"], PROMPTS[2], 7)
    assert whole.usage is not None and whole.usage.completion_tokens == 7


def test_an_encoder_decoder_model_answers_from_its_child(
    url: str, folders: dict[str, Path]
) -> None:
    answer = httpx.post(
        f"{url}/v2/models/t5/generate",
        json={
            "text_input": "translate English to German: the cat",
            "parameters": {"max_tokens": 6},
        },
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    wanted = direct_seq2seq(folders["t5"], "translate English to German: the cat", max_new_tokens=6)
    assert answer.json()["text_output"] == wanted


def test_a_client_that_goes_away_leaves_and_the_next_is_served(
    client: openai.OpenAI, url: str, folders: dict[str, Path]
) -> None:
    stream = client.completions.create(
        model="gpt2", prompt=PROMPTS[0], max_tokens=25, temperature=0, stream=True
    )
    assert next(iter(stream)).choices
    stream.close()  # the client goes away after its first token
    served = threading.Event()
    for _ in range(600):  # polling the metrics, as a dashboard does
        if sequences(url) == 0:
            served.set()
            break
        served.wait(0.05)
    assert served.is_set(), "the cancelled stream never left"
    assert streamed(client, PROMPTS[1], 6) == greedy_text(folders["gpt2"], PROMPTS[1], 6)


def sequences(url: str) -> float:
    """The decode loop's sequences of model gpt2, from ``/metrics``."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "batching_generation_sequences" and sample.labels["model"] == "gpt2":
                return float(sample.value)
    raise AssertionError("no batching_generation_sequences for gpt2")


def test_a_child_killed_mid_stream_fails_that_stream_and_a_new_child_serves(
    tmp_path: Path,
) -> None:
    # Long enough a context that the stream is still generating when its child dies.
    folder = gpt2_folder(tmp_path, "gpt2-long", model_max_length=None, positions=4096)
    config = ModelConfig(
        name="gpt2",
        source=str(folder),
        task="text-generation",
        instance_kind="process",
        batching=BatchingConfig(max_batch_size=4),
    )
    others = {child.pid for child in children("process_host")}
    with serving_in_thread(create_app([config], api_keys=ApiKeys([KEY])), timeout=180) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        (child,) = [c for c in children("process_host") if c.pid not in others]
        stream = client.completions.create(
            model="gpt2", prompt=PROMPTS[3], max_tokens=4000, temperature=0, stream=True
        )
        chunks = iter(stream)
        assert next(chunks).choices
        os.kill(child.pid, signal.SIGKILL)
        with pytest.raises(openai.APIError):
            for _ in chunks:  # the stream ends with an error event: it never looks whole
                pass
        headers = {"Authorization": f"Bearer {KEY}"}
        served = threading.Event()
        for _ in range(600):  # polling the readiness probe, as an orchestrator does
            probe = httpx.get(f"{url}/v2/models/gpt2/ready", headers=headers)
            if probe.status_code == 200:
                served.set()
                break
            served.wait(0.1)
        assert served.is_set(), "a new child never served"
        (fresh,) = [c for c in children("process_host") if c.pid not in others]
        assert fresh.pid != child.pid
        assert streamed(client, PROMPTS[2], 8) == greedy_text(folder, PROMPTS[2], 8)


def test_behind_tls_and_keys_a_pooled_client_streams_from_the_child(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """``server.py`` as a deployment runs it: TLS, a key, the model's batch in a child. One
    pooled client streams, is refused once with a wrong key on the same connection pool, and
    streams again: nothing lost, every answer transformers' own."""
    pki = make_pki(tmp_path / "pki")
    server = ServerProcess(
        "--ssl-certfile",
        str(pki.cert),
        "--ssl-keyfile",
        str(pki.key),
        "--api-key",
        KEY,
        model=[
            "--model",
            str(folders["gpt2"]),
            "--task",
            "text-generation",
            "--name",
            "gpt2",
            "--instance-kind",
            "process",
        ],
        ready_s=180,
    )
    try:
        kids = psutil.Process(server.process.pid).children(recursive=True)
        assert any("process_host" in " ".join(kid.cmdline()) for kid in kids)
        with httpx.Client(verify=pki.client_context(), timeout=60) as pool:
            client = openai.OpenAI(
                base_url=f"{server.url}/v1", api_key=KEY, http_client=pool, max_retries=0
            )
            stranger = openai.OpenAI(
                base_url=f"{server.url}/v1", api_key="sk-wrong", http_client=pool, max_retries=0
            )
            for prompt in PROMPTS[:3]:
                assert streamed(client, prompt, 6) == greedy_text(folders["gpt2"], prompt, 6)
            with pytest.raises(openai.AuthenticationError):
                streamed(stranger, PROMPTS[0], 6)
            assert streamed(client, PROMPTS[3], 6) == greedy_text(folders["gpt2"], PROMPTS[3], 6)
    finally:
        server.stop()
