"""OpenAI ``/v1/completions`` and ``/v1/chat/completions`` on a real server on 127.0.0.1, with
the official ``openai`` SDK, streaming and not; a tiny GPT-2 built from a config, with a chat
template set here (its tokenizer has none)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import transformers
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from batching.errors import InferenceFailed
from batching.keys import ApiKeys
from tests.support.generators import (
    causal_reference,
    gpt2_folder,
    greedy_text,
)
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

KEY = "sk-test-key"
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPTS = ["the cat sat", "a dog", "who eats fish on the mat", "i like green"] * 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = gpt2_folder(tmp_path_factory.mktemp("completions"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


#: The gRPC port, picked as the server starts: one picked at collection, minutes before, may
#: be any connection's port by then.
GRPC_PORT = 0


@pytest.fixture(scope="module")
def url(folder: Path) -> Iterator[str]:
    global GRPC_PORT
    GRPC_PORT = free_port()
    configs = [
        ModelConfig(
            name="gpt2",
            source=str(folder),
            task="text-generation",
            batching=BatchingConfig(max_batch_size=16, max_batch_tokens=600),
        ),
        ModelConfig(
            name="gpt2-tight",
            source=str(folder),
            task="text-generation",
            batching=BatchingConfig(max_batch_size=2, max_batch_tokens=20),
        ),
    ]
    with serving_in_thread(
        create_app(configs, api_keys=ApiKeys([KEY]), grpc_port=GRPC_PORT), timeout=120
    ) as url:
        yield url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def test_a_completion_is_the_greedy_continuation(client: openai.OpenAI, folder: Path) -> None:
    answer = client.completions.create(model="gpt2", prompt=PROMPTS[0], max_tokens=9)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == greedy_text(folder, PROMPTS[0], 9)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 9
    assert answer.usage.prompt_tokens == len(causal_reference(folder)[0](PROMPTS[0])["input_ids"])


def test_a_streamed_completion_sends_the_same_text_in_pieces(
    client: openai.OpenAI, folder: Path
) -> None:
    stream = client.completions.create(
        model="gpt2",
        prompt=PROMPTS[2],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len([text for text in texts if text]) > 1
    assert "".join(texts) == greedy_text(folder, PROMPTS[2], 12)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


def test_sixteen_concurrent_streams_get_their_lone_answers(
    client: openai.OpenAI, folder: Path
) -> None:
    def streamed(prompt: str) -> str:
        stream = client.completions.create(
            model="gpt2", prompt=prompt, max_tokens=10, temperature=0, stream=True
        )
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(streamed, PROMPTS))
    alone = {prompt: greedy_text(folder, prompt, 10) for prompt in set(PROMPTS)}
    assert answers == [alone[prompt] for prompt in PROMPTS]


def test_chat_uses_the_tokenizers_template(client: openai.OpenAI, folder: Path) -> None:
    messages: list[Any] = [{"role": "user", "content": "the cat"}]
    prompt = "user: the cat\nassistant:"
    answer = client.chat.completions.create(model="gpt2", messages=messages, max_tokens=6)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == greedy_text(folder, prompt, 6)
    chunks = list(
        client.chat.completions.create(model="gpt2", messages=messages, max_tokens=6, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == greedy_text(
        folder, prompt, 6
    )
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_answer(client: openai.OpenAI, folder: Path) -> None:
    whole = greedy_text(folder, PROMPTS[1], 12)
    stop = whole[3:5]
    answer = client.completions.create(model="gpt2", prompt=PROMPTS[1], max_tokens=12, stop=stop)
    assert answer.choices[0].text == whole[: whole.find(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sampled() -> str | None:
        answer = client.completions.create(
            model="gpt2", prompt=PROMPTS[3], max_tokens=10, temperature=0.8, top_p=0.9, seed=11
        )
        return answer.choices[0].text

    assert sampled() == sampled()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"n": 17}, "n must be"),
        ({"logprobs": 6}, "logprobs"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 5}, "temperature"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_is_not_applied_is_a_400(
    client: openai.OpenAI, body: dict[str, Any], says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="gpt2", prompt="the cat", extra_body=body)
    assert says in str(refused.value)


def test_keys_and_unknown_models(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).completions.create(
            model="gpt2", prompt="the cat"
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="the cat")


def test_the_stream_is_server_sent_events_ending_with_done(url: str) -> None:
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "gpt2", "prompt": "the cat", "max_tokens": 4, "stream": True},
        timeout=60,
    ) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"


class Failing:
    """A generation whose second piece fails (the model raised on a later step)."""

    finish_reason = echo = None
    prompt_tokens = completion_tokens = 1
    closed = False
    logprobs: list[Any] = []

    async def pieces(self) -> Any:
        yield "a"
        raise InferenceFailed("the model failed on this batch")

    def close(self) -> None:
        self.closed = True


def test_an_error_mid_stream_is_an_error_event_and_no_done() -> None:
    import asyncio

    import orjson

    from batching.codecs.completions import parse_completion
    from batching.http.completions import _events

    parsed = parse_completion(b'{"model": "gpt2", "prompt": "x", "stream": true}')
    generation = Failing()

    async def collect() -> list[bytes]:
        return [event async for event in _events(parsed, [generation], "req-1")]  # type: ignore[list-item]

    events = asyncio.run(collect())
    assert len(events) == 2
    error = orjson.loads(events[-1].removeprefix(b"data: "))
    assert "the model failed" in error["error"]["message"]
    assert generation.closed


# -- KServe v2 generate, as Triton serves it --------------------------------------------------


def test_v2_generate_is_the_greedy_continuation(url: str, folder: Path) -> None:
    answer = httpx.post(
        f"{url}/v2/models/gpt2/generate",
        headers={"authorization": f"Bearer {KEY}"},
        json={"text_input": PROMPTS[0], "parameters": {"max_tokens": 9, "temperature": 0}},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "model_name": "gpt2",
        "model_version": "1",
        "text_output": greedy_text(folder, PROMPTS[0], 9),
    }


def test_v2_generate_stream_sends_events_of_text_output(url: str, folder: Path) -> None:
    with httpx.stream(
        "POST",
        f"{url}/v2/models/gpt2/versions/1/generate_stream",
        headers={"authorization": f"Bearer {KEY}"},
        json={"text_input": PROMPTS[2], "max_new_tokens": 12},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    texts = [json.loads(line.removeprefix("data: "))["text_output"] for line in events]
    assert len(texts) > 1
    assert "".join(texts) == greedy_text(folder, PROMPTS[2], 12)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"text_input": "the cat", "frobnicate": 1}, 400),
        ({"text_input": "the cat", "parameters": {"max_new_tokens": "many"}}, 400),
        ({"parameters": {}}, 400),
        ({"text_input": "the cat", "parameters": {"return_full_text": True}}, 400),
    ],
)
def test_v2_generate_refuses_what_it_cannot_apply(
    url: str, body: dict[str, Any], status: int
) -> None:
    answer = httpx.post(
        f"{url}/v2/models/gpt2/generate",
        headers={"authorization": f"Bearer {KEY}"},
        json=body,
        timeout=60,
    )
    assert answer.status_code == status
    assert "error" in answer.json()


def test_v2_generate_needs_the_key(url: str) -> None:
    answer = httpx.post(
        f"{url}/v2/models/gpt2/generate_stream", json={"text_input": "the cat"}, timeout=60
    )
    assert answer.status_code == 401


# -- gRPC ModelStreamInfer, with tritonclient's stream ---------------------------------------


def stream_texts(url: str, requests: list[tuple[str, str, dict[str, Any]]], **options: Any) -> Any:
    """Each request's (id, text, parameters) through one tritonclient gRPC stream: the
    results and errors its callback got, by request id."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    headers = options.pop("headers", {"authorization": f"Bearer {KEY}"})
    client.start_stream(
        callback=lambda result, error: results.put((result, error)), headers=headers
    )
    for rid, text, parameters in requests:
        tensor = grpcclient.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
        client.async_stream_infer(
            "gpt2", [tensor], request_id=rid, parameters=parameters, **options
        )
    got: dict[str, list[Any]] = {rid: [] for rid, _, _ in requests}
    finished: set[str] = set()
    while len(finished) < len(requests):
        result, error = results.get(timeout=60)
        if error is not None:
            got.setdefault("errors", []).append(error)
            finished.add(f"error-{len(got['errors'])}")
            continue
        response = result.get_response()
        rid = response.id
        output = result.as_numpy("text_output")
        if output is not None:
            got[rid].append(output[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            finished.add(rid)
    client.stop_stream()
    client.close()
    return got


def test_grpc_stream_sends_each_piece_and_a_final_flag(url: str, folder: Path) -> None:
    got = stream_texts(
        url,
        [
            ("a", PROMPTS[0], {"max_new_tokens": 9}),
            ("b", PROMPTS[2], {"max_new_tokens": 12}),
        ],
    )
    assert len(got["a"]) > 1
    assert "".join(got["a"]) == greedy_text(folder, PROMPTS[0], 9)
    assert "".join(got["b"]) == greedy_text(folder, PROMPTS[2], 12)


def test_grpc_stream_with_an_empty_final_response(url: str, folder: Path) -> None:
    got = stream_texts(
        url, [("c", PROMPTS[1], {"max_new_tokens": 5})], enable_empty_final_response=True
    )
    assert "".join(got["c"]) == greedy_text(folder, PROMPTS[1], 5)


def test_grpc_stream_errors_end_their_request_only(url: str, folder: Path) -> None:
    got = stream_texts(
        url,
        [
            ("bad", PROMPTS[0], {"max_new_tokens": "many"}),
            ("good", PROMPTS[3], {"max_new_tokens": 6}),
        ],
    )
    assert len(got["errors"]) == 1
    assert "max_new_tokens" in got["errors"][0].message()
    assert "".join(got["good"]) == greedy_text(folder, PROMPTS[3], 6)


# -- the load tool's streamed generation ------------------------------------------------------


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat", "v2-generate"])
def test_the_load_tool_measures_streams(url: str, api: str) -> None:
    import asyncio

    from load_test.streams import StreamSpec, format_streams, run_streams

    spec = StreamSpec(
        url=url,
        api=api,
        model="gpt2",
        prompts=PROMPTS[:4],
        max_tokens=(4, 8),
        concurrency=3,
        requests=6,
        duration=None,
        headers={"authorization": f"Bearer {KEY}"},
    )
    doc = asyncio.run(run_streams(spec))
    assert doc["outcomes"] == {"200": 6}
    assert doc["output_tokens"] >= 6
    assert doc["ttft"]["p50_ms"] > 0
    assert doc["itl"]["p50_ms"] > 0
    assert "output tokens/s" in format_streams(doc)


def test_grpc_stream_needs_the_key(url: str) -> None:
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensor = grpcclient.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"the cat"], dtype=object))
    # The call is refused when it opens: the request may find the stream already ended,
    # which tritonclient says by raising; the reason reaches the callback either way.
    with contextlib.suppress(InferenceServerException):
        client.async_stream_infer("gpt2", [tensor], request_id="k")
    result, error = results.get(timeout=60)
    assert result is None
    assert "API key" in error.message()
    client.stop_stream()
    client.close()


def test_more_tokens_than_the_budget_is_a_413(client: openai.OpenAI) -> None:
    # gpt2-tight holds 20 tokens: a prompt and its max_tokens must fit in them.
    answer = client.completions.create(model="gpt2-tight", prompt="the cat", max_tokens=4)
    assert answer.choices[0].finish_reason == "length"
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model="gpt2-tight", prompt="the cat", max_tokens=25)
    assert refused.value.status_code == 413
    assert "--max-batch-tokens" in str(refused.value)


def test_a_stream_that_stops_being_read_closes_its_generation() -> None:
    import asyncio

    from batching.codecs.completions import parse_completion
    from batching.http.completions import _events

    class Endless:
        finish_reason = echo = None
        prompt_tokens = completion_tokens = 1
        closed = False
        logprobs: list[Any] = []

        async def pieces(self) -> Any:
            while True:
                yield "a"

        def close(self) -> None:
            self.closed = True

    parsed = parse_completion(b'{"model": "gpt2", "prompt": "x", "stream": true}')
    generation = Endless()

    async def read_one_then_leave() -> None:
        events = _events(parsed, [generation], "req-2")  # type: ignore[list-item]
        await anext(events)
        await events.aclose()  # what Starlette does when the client disconnects

    asyncio.run(read_one_then_leave())
    assert generation.closed


def test_metrics_count_first_tokens_generated_tokens_and_decode_steps(
    url: str, client: openai.OpenAI
) -> None:
    def scrape() -> str:
        return httpx.get(f"{url}/metrics", timeout=30).text

    def value(text: str, name: str) -> float:
        line = f'{name}{{model="gpt2-tight"}} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0

    before = scrape()
    client.completions.create(model="gpt2-tight", prompt="the cat", max_tokens=5)
    after = scrape()
    count = "batching_time_to_first_token_seconds_count"
    assert value(after, count) == value(before, count) + 1
    tokens = "batching_generated_tokens_total"
    assert value(after, tokens) == value(before, tokens) + 5
    # The first token came from the prompt's forward; each of the other four from a decode
    # step, which ran this sequence alone.
    steps = "batching_decode_step_seconds_count"
    assert value(after, steps) == value(before, steps) + 4
    assert value(after, "batching_decode_step_seconds_sum") > value(
        before, "batching_decode_step_seconds_sum"
    )
    rows = "batching_decode_step_sequences_sum"
    assert value(after, rows) == value(before, rows) + 4
    assert value(after, "batching_generation_sequences") == 0
    assert value(after, "batching_generation_reserved_tokens") == 0
