"""The bounds of the OpenAI generation doors, in-process (httpx.ASGITransport on the real
app, a tiny GPT-2): each extreme value is a 400 naming its field, answered before the prompt
is tokenised (a prompt far over the context would otherwise be the context-length 400) and
leaving nothing behind (no stream, no reserved token); and random completion and chat bodies
(hypothesis) never get a 5xx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.asgi import serving
from tests.support.generators import gpt2_folder
from tests.support.metrics import sample

TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
#: Far over the model's context: tokenised, it would be the context-length 400 instead.
HUGE = "the cat sat on the mat " * 20000


class Served:
    """The app served in-process on a loop of this module's own."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.context = serving(app)
        self.client: httpx.AsyncClient = self.loop.run_until_complete(self.context.__aenter__())

    def post(self, path: str, body: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.loop.run_until_complete(
            self.client.post(path, content=content, headers={"content-type": "application/json"})
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.context.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder: Path = gpt2_folder(tmp_path_factory.mktemp("bounds"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    config = ModelConfig(
        name="gpt2",
        source=str(folder),
        task="text-generation",
        batching=BatchingConfig(max_batch_size=8, max_batch_tokens=512, timeout=30.0),
    )
    app = create_app(config, max_body_bytes=2_000_000)
    server = Served(app)
    yield server
    server.close()


def idle(served: Served) -> None:
    """No stream is left, and no token of the budget is reserved."""
    metrics = served.loop.run_until_complete(served.client.get("/metrics")).text
    assert sample(metrics, "batching_generation_sequences", model="gpt2") == 0
    assert sample(metrics, "batching_generation_reserved_tokens", model="gpt2") == 0


COMPLETION_BOUNDS = [
    ({"n": 10**9}, "n"),
    ({"n": 0}, "n"),
    ({"best_of": 10**9}, "best_of"),
    ({"logprobs": 10**9}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"max_tokens": 10**12}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ["x"] * 10_000}, "stop"),
    ({"stop": ["x" * 100_000]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"seed": 2**64}, "seed"),
    ({"seed": -(2**70)}, "seed"),
    ({"temperature": 1e308}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"truncate_prompt_tokens": 10**12}, "truncate_prompt_tokens"),
    ({"top_logprobs": 5}, "top_logprobs"),
    ({"structured_outputs": {"regex": "(" * 100_000}}, "regex"),
]

CHAT_BOUNDS = [
    ({"messages": [{"role": "user", "content": "x"}] * 10_000}, "messages"),
    ({"messages": [{"role": "user", "content": HUGE * 2}]}, "messages"),
    ({"top_logprobs": 10**9, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"chat_template": "{{ 7 * 7 }}"}, "chat_template"),
    ({"chat_template_kwargs": {"chat_template": "{{ x }}"}}, "chat_template_kwargs.chat_template"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ({"chat_template_kwargs": {f"k{i}": 1 for i in range(1000)}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"x": "y" * 100_000}}, "chat_template_kwargs.x"),
    ({"chat_template_kwargs": {"x": {"nested": [1]}}}, "chat_template_kwargs.x"),
    ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"n": 10**9}, "n"),
    ({"echo": True}, "echo"),
]


@pytest.mark.parametrize(("extra", "field"), COMPLETION_BOUNDS)
def test_each_completion_bound_is_a_400_naming_its_field_before_tokenising(
    served: Served, extra: dict[str, Any], field: str
) -> None:
    body = {"model": "gpt2", "prompt": HUGE, **extra}
    answer = served.post("/v1/completions", body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert field in message and "context length" not in message
    idle(served)


@pytest.mark.parametrize(("extra", "field"), CHAT_BOUNDS)
def test_each_chat_bound_is_a_400_naming_its_field_before_tokenising(
    served: Served, extra: dict[str, Any], field: str
) -> None:
    body = {"model": "gpt2", "messages": [{"role": "user", "content": HUGE}], **extra}
    answer = served.post("/v1/chat/completions", body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert field in message and "context length" not in message
    idle(served)


def test_template_kwargs_within_bounds_reach_the_template(served: Served) -> None:
    body = {
        "model": "gpt2",
        "messages": [{"role": "user", "content": "the cat"}],
        "max_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": False, "name": "x"},
    }
    answer = served.post("/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    idle(served)


messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "tool", 3]),
            "content": st.text(max_size=30),
        }
    ),
    max_size=3,
)
values = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10)
)
fields = {
    "n": values,
    "best_of": values,
    "logprobs": values,
    "top_logprobs": values,
    "echo": values,
    "max_tokens": values | st.integers(-2, 64),
    "temperature": values,
    "top_p": values,
    "seed": values,
    "stop": values | st.lists(st.text(max_size=5), max_size=3),
    "stream": st.booleans(),
    "truncate_prompt_tokens": values | st.integers(1, 40),
    "response_format": st.none()
    | st.sampled_from(
        [{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}, {"type": "x"}]
    )
    | st.builds(
        lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        st.dictionaries(st.sampled_from(["type", "properties", "enum"]), values, max_size=2),
    ),
    "structured_outputs": st.none()
    | st.dictionaries(st.sampled_from(["regex", "grammar", "json", "choice"]), values, max_size=2),
    "chat_template_kwargs": st.none() | st.dictionaries(st.text(max_size=6), values, max_size=3),
}


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    chat=st.booleans(),
    chosen=st.fixed_dictionaries({}, optional=fields),
    prompt=st.text(max_size=40) | values,
    chat_messages=messages | values,
)
def test_random_completion_and_chat_bodies_never_get_a_5xx(
    served: Served, chat: bool, chosen: dict[str, Any], prompt: Any, chat_messages: Any
) -> None:
    body: dict[str, Any] = {"model": "gpt2", **chosen}
    if isinstance(chosen.get("max_tokens"), int) and chosen["max_tokens"] > 8:
        body["max_tokens"] = 8  # bounded run time; the bounds test sends the extremes
    if chat:
        body["messages"] = chat_messages
    else:
        body["prompt"] = prompt
    answer = served.post("/v1/chat/completions" if chat else "/v1/completions", body)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert isinstance(answer.json()["error"]["message"], str)
