"""The generation features OpenAI's users rely on, through a real server on 127.0.0.1 read by
the official ``openai`` SDK with its own types: ``logprobs``/``top_logprobs`` in both shapes,
``echo``, ``n`` choices (seeded, streamed with their ``index``), the context-length check in
OpenAI's words and ``truncate_prompt_tokens``, structured outputs (``response_format``
parsed by the SDK's ``parse``, ``structured_outputs`` regex and grammar), and the same
parameters on KServe v2 generate and the gRPC stream. A tiny GPT-2 (byte-level BPE, 128
positions, a chat template set here) and a tiny T5, built from configs."""

from __future__ import annotations

import json
import queue
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pydantic
import pytest
import transformers
import tritonclient.grpc as grpcclient

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.generators import gpt2_folder, t5_folder
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

POSITIONS = 128
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
#: The gRPC port, picked as the server starts: one picked at collection, minutes before, may
#: be any connection's port by then.
GRPC_PORT = 0


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    global GRPC_PORT
    GRPC_PORT = free_port()
    root = tmp_path_factory.mktemp("generation-api")
    folder = gpt2_folder(root, model_max_length=POSITIONS, positions=POSITIONS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    batching = BatchingConfig(max_batch_size=16, max_batch_tokens=16 * POSITIONS)
    configs = [
        ModelConfig(name="gpt2", source=str(folder), task="text-generation", batching=batching),
        ModelConfig(name="t5", source=str(t5_folder(root)), task="summarization"),
    ]
    with serving_in_thread(create_app(configs, grpc_port=GRPC_PORT), timeout=120) as url:
        yield url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_completion_logprobs_have_openais_completions_shape(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="gpt2", prompt="the cat", max_tokens=6, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == answer.usage.completion_tokens == 6  # type: ignore[union-attr]
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert logprobs.text_offset == [
        sum(len(token) for token in logprobs.tokens[:place]) for place in range(6)
    ]
    for value, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top is not None and 1 <= len(top) <= 2
        assert value <= max(top.values()) + 1e-6


def test_streamed_logprobs_are_the_whole_answers(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="gpt2", prompt="a dog", max_tokens=8, logprobs=1)
    chunks = list(
        client.completions.create(
            model="gpt2", prompt="a dog", max_tokens=8, logprobs=1, stream=True
        )
    )
    tokens: list[str] = []
    values: list[float | None] = []
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens or []
            values += chunk.choices[0].logprobs.token_logprobs or []
    assert whole.choices[0].logprobs is not None
    assert tokens == whole.choices[0].logprobs.tokens
    assert values == pytest.approx(whole.choices[0].logprobs.token_logprobs, abs=1e-5)


def test_echo_starts_with_the_prompt_and_its_logprobs(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="gpt2", prompt="the cat sat", max_tokens=3, echo=True, logprobs=1
    )
    text, logprobs = answer.choices[0].text, answer.choices[0].logprobs
    assert text.startswith("the cat sat")
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert logprobs.token_logprobs[0] is None
    assert all(value is not None for value in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens or []) == text
    plain = client.completions.create(model="gpt2", prompt="the cat sat", max_tokens=3, echo=True)
    assert plain.choices[0].text == text
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_have_openais_chat_shape(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "the cat"}]
    answer = client.chat.completions.create(
        model="gpt2", messages=messages, max_tokens=5, logprobs=True, top_logprobs=3
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 5
    for token in logprobs.content:
        assert token.bytes == list(token.token.encode())
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob >= token.logprob - 1e-6
    streamed = client.chat.completions.create(
        model="gpt2", messages=messages, max_tokens=5, logprobs=True, stream=True
    )
    content = [
        token.token
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs is not None
        for token in chunk.choices[0].logprobs.content or []
    ]
    assert content == [token.token for token in logprobs.content]


def test_n_choices_each_a_seeded_row_streamed_with_their_index(client: openai.OpenAI) -> None:
    sampled: dict[str, Any] = {"model": "gpt2", "max_tokens": 8, "temperature": 1.0}
    answer = client.completions.create(prompt="the cat", n=3, seed=40, **sampled)
    texts = [choice.text for choice in answer.choices]
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert len(set(texts)) > 1
    assert answer.usage is not None and answer.usage.completion_tokens == 24
    # Choice i draws with seed + i: alone, and among other requests.
    alone = [
        client.completions.create(prompt="the cat", seed=40 + i, **sampled).choices[0].text
        for i in range(3)
    ]
    assert alone == texts
    with ThreadPoolExecutor(8) as pool:
        company = list(
            pool.map(
                lambda n: client.completions.create(
                    prompt="the cat" if n % 2 else "a dog", n=3, seed=40, **sampled
                ),
                range(8),
            )
        )
    for n, other in enumerate(company):
        if n % 2:
            assert [choice.text for choice in other.choices] == texts
    chunks = list(
        client.completions.create(
            prompt="the cat",
            n=3,
            seed=40,
            stream=True,
            stream_options={"include_usage": True},
            **sampled,
        )
    )
    streamed = ["", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24


def test_best_of_is_refused_unless_it_is_n(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model="gpt2", prompt="x", max_tokens=2, n=1, best_of=2)
    answer = client.completions.create(model="gpt2", prompt="x", max_tokens=2, n=2, best_of=2)
    assert len(answer.choices) == 2


def test_a_prompt_over_the_context_is_a_400_in_openais_words(client: openai.OpenAI) -> None:
    prompt = "the cat sat on the mat " * 40
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="gpt2", prompt=prompt, max_tokens=10)
    message = str(refused.value)
    assert f"maximum context length is {POSITIONS} tokens" in message
    assert "However, you requested" in message and "10 in the completion" in message
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(
            model="gpt2", messages=[{"role": "user", "content": prompt}], max_tokens=10
        )
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="gpt2", prompt="the cat", max_tokens=POSITIONS)
    cut = client.completions.create(
        model="gpt2", prompt=prompt, max_tokens=10, extra_body={"truncate_prompt_tokens": 20}
    )
    assert cut.usage is not None and cut.usage.prompt_tokens == 20


def test_max_tokens_defaults_to_what_is_left_of_the_context(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="gpt2", prompt="the cat sat")
    assert answer.usage is not None
    if answer.choices[0].finish_reason == "length":
        assert answer.usage.total_tokens == POSITIONS
    else:
        assert answer.usage.total_tokens < POSITIONS


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=6)
    age: int = pydantic.Field(ge=0, le=20)
    indoor: bool


def test_the_sdks_parse_reads_a_schema_constrained_answer(client: openai.OpenAI) -> None:
    parsed = client.chat.completions.parse(
        model="gpt2",
        messages=[{"role": "user", "content": "a pet"}],
        response_format=Pet,
        max_tokens=60,
    )
    pet = parsed.choices[0].message.parsed
    assert isinstance(pet, Pet)
    assert 0 <= pet.age <= 20


def test_json_object_regex_and_grammar_constrain_the_answer(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="gpt2",
        prompt="the cat",
        max_tokens=60,
        extra_body={"response_format": {"type": "json_object"}},
    )
    # Any object: its keys and strings are free, and may run to max_tokens (then unfinished).
    assert answer.choices[0].text.startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(answer.choices[0].text), dict)
    regex = "(cat|dog)-[0-9]{2}"
    for stream in (False, True):
        made = client.completions.create(
            model="gpt2",
            prompt="the cat",
            max_tokens=20,
            stream=stream,
            extra_body={"structured_outputs": {"regex": regex}},
        )
        text = (
            "".join(chunk.choices[0].text for chunk in made if chunk.choices)  # type: ignore[union-attr]
            if stream
            else made.choices[0].text  # type: ignore[union-attr]
        )
        assert re.fullmatch(regex, text), text
    grammar = 'start: "yes" | "no" | "maybe"'
    chat = client.chat.completions.create(
        model="gpt2",
        messages=[{"role": "user", "content": "well?"}],
        max_tokens=10,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    assert chat.choices[0].message.content in ("yes", "no", "maybe")
    assert chat.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format",
        ),
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: missing"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": ["a"]}}, "structured_outputs.choice"),
    ],
)
def test_an_invalid_constraint_is_a_400_naming_the_field_and_the_server_goes_on(
    client: openai.OpenAI, extra: dict[str, Any], names: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=re.escape(names)):
        client.completions.create(model="gpt2", prompt="x", max_tokens=2, extra_body=extra)
    with pytest.raises(openai.BadRequestError, match=re.escape(names)):
        client.chat.completions.create(
            model="gpt2",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
            extra_body=extra,
        )
    assert client.completions.create(model="gpt2", prompt="x", max_tokens=2).choices


def test_an_encoder_decoder_gives_logprobs_and_refuses_echo(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="t5", prompt="the cat sat", max_tokens=4, logprobs=1)
    assert answer.choices[0].logprobs is not None
    assert len(answer.choices[0].logprobs.tokens or []) == answer.usage.completion_tokens  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="t5", prompt="the cat", max_tokens=4, echo=True)


def test_kserve_generate_takes_the_constraint_and_answers_logprobs(url: str) -> None:
    body = {
        "text_input": "the cat",
        "parameters": {"max_tokens": 6, "regex": "[0-9]+", "logprobs": 2},
    }
    answer = httpx.post(f"{url}/v2/models/gpt2/generate", json=body, timeout=60).json()
    assert re.fullmatch("[0-9]+", answer["text_output"])
    assert "".join(entry["token"] for entry in answer["logprobs"]) == answer["text_output"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in answer["logprobs"])
    with httpx.stream(
        "POST", f"{url}/v2/models/gpt2/generate_stream", json=body, timeout=60
    ) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line]
    assert "".join(e["text_output"] for e in events) == answer["text_output"]
    assert sum(len(e["logprobs"]) for e in events) == len(answer["logprobs"])
    bad = httpx.post(
        f"{url}/v2/models/gpt2/generate",
        json={"text_input": "x", "parameters": {"json_schema": '{"type": "nope"}'}},
        timeout=60,
    )
    assert bad.status_code == 400 and "json_schema" in bad.json()["error"]


def test_the_grpc_stream_takes_the_constraint_and_sends_a_logprobs_output(url: str) -> None:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensor = grpcclient.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"the cat"], dtype=object))
    parameters = {"max_new_tokens": 5, "regex": "[a-c]+", "logprobs": 1}
    text, entries = "", []
    try:
        client.async_stream_infer("gpt2", [tensor], request_id="r1", parameters=parameters)
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error.message()
            output = result.as_numpy("text_output")
            text += output[0].decode() if output is not None else ""
            entries += json.loads(result.as_numpy("logprobs")[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert re.fullmatch("[a-c]+", text)
    assert "".join(entry["token"] for entry in entries) == text


def test_the_plain_door_constrains_and_refuses_logprobs_it_cannot_answer(url: str) -> None:
    made = httpx.post(
        f"{url}/models/gpt2",
        json={
            "inputs": ["the cat"],
            "parameters": {"max_new_tokens": 5, "regex": "[xyz]+", "return_full_text": False},
        },
        timeout=60,
    )
    assert made.status_code == 200, made.text
    assert re.fullmatch("[xyz]+", made.json()["outputs"][0]["generated_text"])
    refused = httpx.post(
        f"{url}/models/gpt2", json={"inputs": ["x"], "parameters": {"logprobs": 1}}, timeout=60
    )
    assert refused.status_code == 400 and "logprobs" in refused.json()["error"]
