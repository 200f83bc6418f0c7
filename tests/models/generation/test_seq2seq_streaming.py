"""The streaming doors serve the encoder-decoder tasks (summarization, translation,
text2text-generation) token by token, on a real server on 127.0.0.1: the official ``openai``
SDK (streaming and not, chat with and without a chat template), KServe v2 generate_stream,
tritonclient's gRPC stream; a short request ends while a long one runs, a client that goes
away stops its sequence, and a failing sequence fails alone. Tiny T5 and BART built from a
config."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import transformers
import tritonclient.grpc as grpcclient

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.generators import bart_folder, direct_seq2seq, t5_folder
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPTS = ["the cat sat", "a dog", "who eats fish on the mat", "i like green"] * 4
#: The gRPC port, picked as the server starts: one picked at collection, minutes before, may
#: be any connection's port by then.
GRPC_PORT = 0


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq2seq-streaming")
    bart = bart_folder(root)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(bart))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(bart)
    return {"t5": t5_folder(root), "bart": bart}


@pytest.fixture(scope="module")
def url(folders: dict[str, Path]) -> Iterator[str]:
    global GRPC_PORT
    GRPC_PORT = free_port()
    batching = BatchingConfig(max_batch_size=16, max_batch_tokens=8000)
    configs = [
        ModelConfig(name="t5", source=str(folders["t5"]), task="summarization", batching=batching),
        ModelConfig(
            name="t5-fr", source=str(folders["t5"]), task="translation_en_to_fr", batching=batching
        ),
        ModelConfig(
            name="bart", source=str(folders["bart"]), task="text2text-generation", batching=batching
        ),
    ]
    with serving_in_thread(create_app(configs, grpc_port=GRPC_PORT), timeout=120) as url:
        yield url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def summary(folders: dict[str, Path], text: str, tokens: int) -> str:
    return direct_seq2seq(folders["t5"], "summarize: " + text, max_new_tokens=tokens)


def test_a_completion_is_the_greedy_summary(
    client: openai.OpenAI, folders: dict[str, Path], url: str
) -> None:
    answer = client.completions.create(model="t5", prompt=PROMPTS[0], max_tokens=8)
    assert answer.choices[0].text == summary(folders, PROMPTS[0], 8)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["t5"]))
    assert answer.usage.prompt_tokens == len(tokenizer("summarize: " + PROMPTS[0])["input_ids"])
    # The whole-batch door answers the same text.
    plain = httpx.post(
        f"{url}/models/t5",
        json={"inputs": [PROMPTS[0]], "parameters": {"max_new_tokens": 8}},
        timeout=60,
    )
    assert plain.json()["outputs"] == [{"summary_text": answer.choices[0].text}]


def test_a_streamed_completion_sends_the_same_text_in_pieces(
    client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    chunks = list(
        client.completions.create(
            model="t5",
            prompt=PROMPTS[2],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len([text for text in texts if text]) > 1
    assert "".join(texts) == summary(folders, PROMPTS[2], 12)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_sixteen_concurrent_streams_get_their_lone_answers(
    client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    def streamed(prompt: str) -> str:
        stream = client.completions.create(
            model="bart", prompt=prompt, max_tokens=10, temperature=0, stream=True
        )
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(streamed, PROMPTS))
    alone = {p: direct_seq2seq(folders["bart"], p, max_new_tokens=10) for p in set(PROMPTS)}
    assert answers == [alone[prompt] for prompt in PROMPTS]


def test_chat_uses_the_template_or_is_a_422_without_one(
    client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    messages: list[Any] = [{"role": "user", "content": "the cat"}]
    answer = client.chat.completions.create(model="bart", messages=messages, max_tokens=6)
    prompt = "user: the cat\nassistant:"
    assert answer.choices[0].message.content == direct_seq2seq(
        folders["bart"], prompt, max_new_tokens=6
    )
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(model="t5", messages=messages, max_tokens=6)
    assert "chat template" in str(refused.value)


def test_v2_generate_stream_translates_to_the_language_asked(
    url: str, folders: dict[str, Path]
) -> None:
    with httpx.stream(
        "POST",
        f"{url}/v2/models/t5-fr/generate_stream",
        json={"text_input": "the cat", "parameters": {"max_tokens": 6, "tgt_lang": "de"}},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line]
    texts = [json.loads(line.removeprefix("data: "))["text_output"] for line in events]
    german = direct_seq2seq(folders["t5"], "translate English to German: the cat", max_new_tokens=6)
    assert "".join(texts) == german
    french = httpx.post(
        f"{url}/v2/models/t5-fr/generate",
        json={"text_input": "the cat", "parameters": {"max_tokens": 6}},
        timeout=60,
    )
    assert french.json()["text_output"] == direct_seq2seq(
        folders["t5"], "translate English to French: the cat", max_new_tokens=6
    )
    assert french.json()["text_output"] != german


def test_grpc_stream_and_a_failing_sequence_fails_alone(url: str, folders: dict[str, Path]) -> None:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    long = " ".join(PROMPTS * 3)  # more than the encoder takes
    requests = [
        ("a", PROMPTS[0], {"max_new_tokens": 9}),
        ("bad", long, {"truncate": False}),
        ("b", PROMPTS[3], {"max_new_tokens": 7}),
    ]
    for rid, text, parameters in requests:
        tensor = grpcclient.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
        client.async_stream_infer("t5", [tensor], request_id=rid, parameters=parameters)
    got: dict[str, list[str]] = {"a": [], "b": []}
    errors: list[Any] = []
    finished: set[str] = set()
    while len(finished) + len(errors) < len(requests):
        result, error = results.get(timeout=60)
        if error is not None:
            errors.append(error)
            continue
        response = result.get_response()
        output = result.as_numpy("text_output")
        if output is not None:
            got[response.id].append(output[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            finished.add(response.id)
    client.stop_stream()
    client.close()
    assert len(errors) == 1 and "takes at most" in errors[0].message()
    assert len(got["a"]) > 1
    assert "".join(got["a"]) == summary(folders, PROMPTS[0], 9)
    assert "".join(got["b"]) == summary(folders, PROMPTS[3], 7)


def gauge(url: str, name: str, model: str) -> float:
    line = f'{name}{{model="{model}"}} '
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_short_request_ends_while_a_long_one_runs_and_a_disconnect_stops_it(
    url: str, client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    # The tiny T5 never says its end token (and its answer to this prompt is text from the
    # first tokens on): 3000 tokens run until the client goes away.
    body = {"model": "t5", "prompt": PROMPTS[0], "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as long:
        assert long.status_code == 200
        lines = long.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
        short = client.completions.create(model="t5", prompt=PROMPTS[3], max_tokens=2)
        assert short.choices[0].text == summary(folders, PROMPTS[3], 2)
        # The short one has ended; the long one still holds its row and its tokens.
        assert gauge(url, "batching_generation_sequences", "t5") == 1
        assert gauge(url, "batching_generation_reserved_tokens", "t5") >= 3000
    # The client went away: its sequence leaves at the next step, and its tokens are free.
    for _ in range(600):
        if gauge(url, "batching_generation_sequences", "t5") == 0:
            break
        httpx.get(f"{url}/v2/health/ready", timeout=30)
    assert gauge(url, "batching_generation_sequences", "t5") == 0
    assert gauge(url, "batching_generation_reserved_tokens", "t5") == 0


def test_the_plain_door_runs_the_same_loop_and_a_client_that_goes_away_stops_it(
    url: str, folders: dict[str, Path]
) -> None:
    import asyncio

    def closed(text: str) -> float:
        line = 'batching_requests_total{code="499",model="t5"} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0

    answer = httpx.post(
        f"{url}/models/t5",
        json={"inputs": [PROMPTS[3]], "parameters": {"max_new_tokens": 2}},
        timeout=60,
    )
    assert answer.json()["outputs"] == [{"summary_text": summary(folders, PROMPTS[3], 2)}]
    before = closed(httpx.get(f"{url}/metrics", timeout=30).text)

    async def leave_while_it_runs() -> None:
        # 3000 tokens of the tiny T5 run until the client goes away (it never says its end).
        body = {"inputs": [PROMPTS[0]], "parameters": {"max_new_tokens": 3000}}
        async with httpx.AsyncClient(timeout=60) as client:
            posted = asyncio.create_task(client.post(f"{url}/models/t5", json=body))
            for _ in range(600):
                running = await asyncio.to_thread(gauge, url, "batching_generation_sequences", "t5")
                if running == 1:
                    break
            assert running == 1
            posted.cancel()  # the connection closes under the request

    asyncio.run(leave_while_it_runs())
    for _ in range(600):
        if gauge(url, "batching_generation_sequences", "t5") == 0:
            break
        httpx.get(f"{url}/v2/health/ready", timeout=30)
    assert gauge(url, "batching_generation_reserved_tokens", "t5") == 0
    for _ in range(600):
        if closed(httpx.get(f"{url}/metrics", timeout=30).text) == before + 1:
            break
    assert closed(httpx.get(f"{url}/metrics", timeout=30).text) == before + 1
