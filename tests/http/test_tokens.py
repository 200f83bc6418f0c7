"""``/tokenize``, ``/decode`` and ``/embed_all`` in-process, on a stand-in model that declares
them (one token per character, see tests/support/token_models.py): their answers, their
option and error rules, and that their items go through the model's queue like any other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.asgi import serving
from tests.support.metrics import sample
from tests.support.models import GatedModel, VectorModel
from tests.support.token_models import CLS, SEP, VOCAB_SIZE, CharTokenModel, LongCharTokenModel

pytestmark = pytest.mark.anyio


def ids_of(text: str) -> list[int]:
    return [CLS, *(ord(char) + 3 for char in text), SEP]


class Served:
    def __init__(self) -> None:
        self.chars = CharTokenModel()
        self.plain = VectorModel()
        self.long = LongCharTokenModel()

    def build(self, config: ModelConfig) -> Any:
        return {"chars": self.chars, "plain": self.plain, "long": self.long}[config.name]


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, Served]]:
    models = Served()
    configs = [
        ModelConfig(
            name="chars", batching=BatchingConfig(max_batch_size=8, max_items_per_request=4)
        ),
        ModelConfig(name="plain"),
        ModelConfig(name="long", batching=BatchingConfig(max_batch_size=32)),
    ]
    async with serving(create_app(configs, builder=models.build)) as client:
        yield client, models


async def test_tokenize_answers_ids_tokens_and_offsets_with_usage(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, _ = served
    response = await client.post("/tokenize", json={"inputs": ["ab", "c"]})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "chars"
    assert answer["tokens"][0] == [
        {"id": CLS, "text": "[CLS]", "special": True, "start": 0, "stop": 0},
        {"id": ord("a") + 3, "text": "a", "special": False, "start": 0, "stop": 1},
        {"id": ord("b") + 3, "text": "b", "special": False, "start": 1, "stop": 2},
        {"id": SEP, "text": "[SEP]", "special": True, "start": 0, "stop": 0},
    ]
    assert [token["id"] for token in answer["tokens"][1]] == ids_of("c")
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


async def test_tokenize_takes_one_text_a_prompt_and_no_special_tokens(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, _ = served
    response = await client.post(
        "/tokenize",
        json={"inputs": "x", "prompt_name": "query", "add_special_tokens": False, "model": "chars"},
    )
    assert response.status_code == 200, response.text
    tokens = response.json()["tokens"]
    assert len(tokens) == 1
    assert [(t["text"], t["start"], t["stop"]) for t in tokens[0]] == [
        ("q", 0, 1),
        (":", 1, 2),
        (" ", 2, 3),
        ("x", 3, 4),
    ]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"inputs": "a", "add_special_token": True}, "no key 'add_special_token'"),
        ({"inputs": "a", "add_special_tokens": "yes"}, "true or false"),
        ({"inputs": 3}, "a text or a list of texts"),
        ({"inputs": ["a", 3]}, "inputs[1] is int"),
        ({"inputs": []}, "empty list"),
        ({}, '"inputs"'),
        ({"inputs": "a", "prompt_name": "passage"}, "no prompt named 'passage'"),
        ({"inputs": "a", "model": 7}, "'model' must be a string"),
        ([1, 2], "JSON object"),
    ],
)
async def test_tokenize_refuses_bad_bodies_with_400(
    served: tuple[httpx.AsyncClient, Served], body: Any, words: str
) -> None:
    client, _ = served
    response = await client.post("/tokenize", json=body)
    assert response.status_code == 400
    assert words in response.json()["error"]


async def test_a_model_without_the_capability_is_a_422_naming_those_with_it(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, models = served
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/tokenize", {"inputs": "a"}),
        ("/decode", {"ids": [5]}),
        ("/embed_all", {"inputs": "a"}),
    ]
    for route, body in cases:
        response = await client.post(route, json={**body, "model": "plain"})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert f"does not serve {route}" in error and "'chars', 'long'" in error
    assert models.plain.batches == []
    unknown = await client.post("/tokenize", json={"inputs": "a", "model": "nope"})
    assert unknown.status_code == 404


async def test_decode_answers_one_text_per_sequence(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, _ = served
    one = await client.post("/decode", json={"ids": ids_of("hi")})
    assert one.status_code == 200, one.text
    assert one.json() == {"model": "chars", "texts": ["hi"]}
    many = await client.post(
        "/decode", json={"ids": [ids_of("a"), [], ids_of("b")], "skip_special_tokens": False}
    )
    assert many.json()["texts"] == ["[CLS]a[SEP]", "", "[CLS]b[SEP]"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"ids": [5, -1]}, 400, "ids[1] is -1"),
        ({"ids": [[5], [True]]}, 400, "ids[1][0] is True"),
        ({"ids": [5, 2.0]}, 400, "integer >= 0"),
        ({"ids": [5, [6]]}, 400, "mixes"),
        ({"ids": "5"}, 400, '"ids"'),
        ({"ids": [5], "skip_special_tokens": 1}, 400, "true or false"),
        ({"ids": [5], "text": "a"}, 400, "no key 'text'"),
        ({"ids": [5, VOCAB_SIZE]}, 422, f"ids run from 0 to {VOCAB_SIZE - 1}"),
    ],
)
async def test_decode_refuses_bad_ids(
    served: tuple[httpx.AsyncClient, Served], body: Any, status: int, words: str
) -> None:
    client, models = served
    response = await client.post("/decode", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert models.chars.batches == []


async def test_embed_all_answers_every_tokens_vector_with_its_id(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, _ = served
    response = await client.post("/embed_all", json={"inputs": ["ab", "c"]})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["ids"] == [ids_of("ab"), ids_of("c")]
    assert answer["embeddings"][0] == [[i, position, 4] for position, i in enumerate(ids_of("ab"))]
    assert len(answer["embeddings"][1]) == 3
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


async def test_embed_all_applies_the_prompt_and_the_truncation_side(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, _ = served
    text = "abcdefghijklmnop"  # 16 characters; the model keeps 10 between [CLS] and [SEP]
    right = await client.post("/embed_all", json={"inputs": text})
    left = await client.post("/embed_all", json={"inputs": text, "truncation_direction": "Left"})
    prompted = await client.post("/embed_all", json={"inputs": "x", "prompt_name": "query"})
    assert right.json()["ids"] == [ids_of(text[:10])]
    assert left.json()["ids"] == [ids_of(text[-10:])]
    assert prompted.json()["ids"] == [ids_of("q: x")]


async def test_embed_all_without_truncation_refuses_a_long_text_with_413(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, models = served
    fits = await client.post("/embed_all", json={"inputs": "a" * 10, "truncate": False})
    assert fits.status_code == 200
    response = await client.post(
        "/embed_all", json={"inputs": ["short", "a" * 13], "truncate": False}
    )
    assert response.status_code == 413
    error = response.json()["error"]
    assert "input 1 has 15 tokens" in error and "limit of 12 tokens" in error
    # The prompt counts: 8 characters fit alone, not after "q: ".
    prompted = await client.post(
        "/embed_all", json={"inputs": "a" * 8, "truncate": False, "prompt_name": "query"}
    )
    assert prompted.status_code == 413
    assert len(models.chars.batches) == 1


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"inputs": "a", "truncate": "no"}, "true or false"),
        ({"inputs": "a", "truncation_direction": "middle"}, "'left' or 'right'"),
        ({"inputs": "a", "normalize": True}, "no key 'normalize'"),
        ({"inputs": "a", "dimensions": 2}, "per-token vectors keep their width"),
        ({"inputs": "a", "encoding": "int8"}, "per-token vectors are float"),
        ({"inputs": "a", "input_type": "nothing"}, "no prompt for input_type"),
    ],
)
async def test_embed_all_refuses_bad_options_with_400(
    served: tuple[httpx.AsyncClient, Served], body: Any, words: str
) -> None:
    client, _ = served
    response = await client.post("/embed_all", json=body)
    assert response.status_code == 400
    assert words in response.json()["error"]


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"dimensions": 2}, "keep their width"),
        ({"encoding": "int8"}, "per-token vectors are float"),
        ({"shuffle": True}, "unknown parameter 'shuffle'"),
    ],
)
async def test_a_per_token_output_s_own_parameters_are_applied_or_refused(
    served: tuple[httpx.AsyncClient, Served], parameters: dict[str, Any], words: str
) -> None:
    # Raw v2 JSON may set options on a requested output, as on the pooled one: never ignored.
    client, _ = served
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["ab"]}],
        "outputs": [{"name": "token_ids", "parameters": parameters}],
    }
    response = await client.post("/v2/models/chars/infer", json=body)
    assert response.status_code == 400
    assert words in response.json()["error"]


async def test_the_items_go_through_the_models_queue_and_its_limits(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, models = served
    too_many = await client.post("/tokenize", json={"inputs": ["a"] * 5})
    assert too_many.status_code == 413
    assert "at most 4 items" in too_many.json()["error"]
    response = await client.post(
        "/decode", json={"ids": [[5]]}, headers={"x-request-id": "decode-1"}
    )
    assert response.headers["x-request-id"] == "decode-1"
    bad_timeout = await client.post(
        "/embed_all", json={"inputs": "a"}, headers={"x-request-timeout-ms": "0"}
    )
    assert bad_timeout.status_code == 400
    metrics = (await client.get("/metrics")).text
    assert sample(metrics, "batching_requests_total", model="chars", code="413") == 1
    assert sample(metrics, "batching_requests_total", model="chars", code="200") == 1
    assert sample(metrics, "batching_requests_total", model="chars", code="400") == 1
    assert models.chars.batches == [[models.chars.batches[0][0]]]


async def test_bodies_over_the_limit_are_413_before_any_model() -> None:
    app = create_app(
        ModelConfig(name="chars"), builder=lambda _: CharTokenModel(), max_body_bytes=64
    )
    async with serving(app) as client:
        response = await client.post("/embed_all", json={"inputs": "a" * 100})
        assert response.status_code == 413
        metrics = (await client.get("/metrics")).text
        assert sample(metrics, "batching_requests_total", model="", code="413") == 1


async def test_per_token_batches_are_capped_by_tokens_not_items(
    served: tuple[httpx.AsyncClient, Served],
) -> None:
    client, models = served
    texts = [f"{index}" + "x" * 1999 for index in range(10)]  # 2002 tokens each
    dense = await client.post("/models/long", json={"inputs": texts})
    assert dense.status_code == 200
    assert [len(batch) for batch in models.long.batches] == [10]
    models.long.batches.clear()
    tokens = await client.post("/embed_all", json={"inputs": texts, "model": "long"})
    assert tokens.status_code == 200, tokens.text
    # At most 16384 padded tokens per batch (no --max-batch-tokens): 8 x 2002 = 16016.
    assert [len(batch) for batch in models.long.batches] == [8, 2]
    assert tokens.json()["usage"]["total_tokens"] == 10 * 2002


async def test_per_token_batches_follow_max_batch_tokens() -> None:
    model = CharTokenModel()
    config = ModelConfig(name="chars", batching=BatchingConfig(max_batch_tokens=30))
    async with serving(create_app(config, builder=lambda _: model)) as client:
        response = await client.post("/embed_all", json={"inputs": ["a" * 10] * 5})
        assert response.status_code == 200, response.text
        # 12 tokens each: 2 x 12 = 24 fits under 30, 3 x 12 = 36 does not.
        assert [len(batch) for batch in model.batches] == [2, 2, 1]


async def test_a_model_still_loading_is_503_not_a_wrong_refusal() -> None:
    from tests.support.models import SlowLoadModel

    model = SlowLoadModel()
    app = create_app(ModelConfig(name="slow"), builder=lambda _: model)
    async with serving(app, wait_ready=False) as client:
        response = await client.post("/tokenize", json={"inputs": "a"})
        assert response.status_code == 503
        assert "Retry-After" in response.headers
        model.loaded.set()


class GatedCharModel(GatedModel, CharTokenModel):
    """The stand-in model, blocking in ``predict`` until the test opens its gate."""


async def test_the_deadline_holds_for_token_requests() -> None:
    model = GatedCharModel()
    async with serving(create_app(ModelConfig(name="chars"), builder=lambda _: model)) as client:
        try:
            for route, body in [("/tokenize", {"inputs": "a"}), ("/embed_all", {"inputs": "a"})]:
                response = await client.post(
                    route, json=body, headers={"x-request-timeout-ms": "50"}
                )
                assert response.status_code == 504, response.text
                assert "the deadline the request asked for (50 ms)" in response.json()["error"]
        finally:
            model.gate.set()


async def test_the_token_routes_need_the_api_key_like_every_door() -> None:
    from batching.keys import ApiKeys

    key = "token-doors-test-key"
    app = create_app(
        ModelConfig(name="chars"), builder=lambda _: CharTokenModel(), api_keys=ApiKeys([key])
    )
    async with serving(app) as client:
        for route, body in [
            ("/tokenize", {"inputs": "a"}),
            ("/decode", {"ids": [5]}),
            ("/embed_all", {"inputs": "a"}),
        ]:
            refused = await client.post(route, json=body)
            assert refused.status_code == 401, route
            allowed = await client.post(
                route, json=body, headers={"authorization": f"Bearer {key}"}
            )
            assert allowed.status_code == 200, allowed.text
