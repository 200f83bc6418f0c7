"""The ASGI app in-process, lifespan running: every route and every status code."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from tests.support.asgi import app_with, echo_config, serving, wait_until_ready
from tests.support.models import EchoModel, GatedModel, SlowLoadModel

pytestmark = pytest.mark.anyio


async def test_plain_text_body_answers_one_output() -> None:
    async with serving(app_with(EchoModel())) as client:
        response = await client.post(
            "/", content=b"some text", headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert response.status_code == 200
        assert response.json() == {
            "model": "echo",
            "outputs": [{"input": "some text", "length": 9}],
        }
        assert response.headers["x-request-id"]


async def test_json_inputs_answer_one_output_per_input_in_order() -> None:
    async with serving(app_with(EchoModel())) as client:
        listed = await client.post("/", json={"inputs": ["a", "bb", "ccc"]})
        single = await client.post("/", json={"inputs": "solo"})
        named = await client.post("/models/echo", json={"inputs": ["x"]})
        untyped = await client.post("/", content=b'{"inputs": ["curl", "json"]}')
    assert [out["input"] for out in listed.json()["outputs"]] == ["a", "bb", "ccc"]
    assert single.json()["outputs"] == [{"input": "solo", "length": 4}]
    assert named.json()["outputs"] == [{"input": "x", "length": 1}]
    assert [out["input"] for out in untyped.json()["outputs"]] == ["curl", "json"]


@pytest.mark.parametrize(
    ("content", "content_type", "status", "fragment"),
    [
        (b"", "text/plain", 400, "empty"),
        (b"   ", "application/json", 400, "empty"),
        (b'{"inputs": ', "application/json", 400, "not valid JSON"),
        (b"[1, 2]", "application/json", 400, "must be an object"),
        (b'{"text": "a"}', "application/json", 400, 'no "inputs"'),
        (b'{"inputs": []}', "application/json", 400, "empty list"),
        (b'{"inputs": null}', "application/json", 400, "null"),
        (b"\xff\xfe\xfa", "text/plain", 400, "UTF-8"),
        (b'{"inputs": [1, 2]}', "application/json", 422, "inputs[0] is int"),
        (b'{"inputs": ["ok", {"a": 1}]}', "application/json", 422, "inputs[1] is dict"),
    ],
)
async def test_malformed_input_gets_a_4xx_with_a_json_error(
    content: bytes, content_type: str, status: int, fragment: str
) -> None:
    async with serving(app_with(EchoModel())) as client:
        response = await client.post("/", content=content, headers={"content-type": content_type})
    assert response.status_code == status
    assert fragment in response.json()["error"]


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded"])
@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"inputs": ["a", ', "starts with '{', so it was read as JSON"),
        (b"  [MASK] is the capital of France", "starts with '[', so it was read as JSON"),
        (b'["a", "b"]', "must be an object"),
        (b'{"text": "a"}', 'no "inputs"'),
    ],
)
async def test_a_body_that_starts_like_json_without_a_json_type_is_json(
    content: bytes, fragment: str, content_type: str | None
) -> None:
    # No content type, or curl -d's: the first character decides, and JSON that does not parse
    # (or is not {"inputs": ...}) is a 400 that says how to send such a text instead.
    headers = {} if content_type is None else {"content-type": content_type}
    async with serving(app_with(EchoModel())) as client:
        response = await client.post("/", content=content, headers=headers)
        as_text = await client.post(
            "/", content=content, headers={"content-type": "text/plain; charset=utf-8"}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error and "set Content-Type: text/plain" in error
    # Said to be text, the same body is one text input.
    assert as_text.status_code == 200
    assert as_text.json()["outputs"] == [{"input": content.decode(), "length": len(content)}]


async def test_a_body_that_does_not_start_like_json_is_one_text() -> None:
    async with serving(app_with(EchoModel())) as client:
        bare = await client.post("/", content=b'say {"inputs": 1}', headers={"content-type": ""})
        octets = await client.post(
            "/", content=b"{not json", headers={"content-type": "application/octet-stream"}
        )
    assert bare.json()["outputs"] == [{"input": 'say {"inputs": 1}', "length": 17}]
    assert octets.json()["outputs"] == [{"input": "{not json", "length": 9}]


async def test_unknown_routes_and_methods_answer_json() -> None:
    async with serving(app_with(EchoModel())) as client:
        missing_model = await client.post("/models/nope", json={"inputs": ["a"]})
        missing_route = await client.get("/nowhere")
        wrong_method = await client.get("/")
    assert missing_model.status_code == 404
    assert "nope" in missing_model.json()["error"]
    assert missing_route.status_code == 404 and missing_route.json()["error"]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]


async def test_a_body_over_the_limit_is_413() -> None:
    async with serving(app_with(EchoModel(), max_body_bytes=100)) as client:
        response = await client.post("/", content=b"x" * 101)
    assert response.status_code == 413
    assert "limit" in response.json()["error"]


async def test_too_many_items_is_413() -> None:
    app = app_with(EchoModel(), echo_config(max_items_per_request=2))
    async with serving(app) as client:
        response = await client.post("/", json={"inputs": ["a", "b", "c"]})
    assert response.status_code == 413


async def test_live_at_once_ready_only_once_loaded() -> None:
    model = SlowLoadModel()
    async with serving(app_with(model), wait_ready=False) as client:
        assert (await client.get("/v2/health/live")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 503
        refused = await client.post("/", content=b"early")
        assert refused.status_code == 503
        assert "not ready" in refused.json()["error"]
        assert refused.headers["retry-after"]
        model.loaded.set()
        await wait_until_ready(client)
        assert (await client.post("/", content=b"now")).status_code == 200


async def test_a_request_past_its_deadline_is_504() -> None:
    model = GatedModel()
    async with serving(app_with(model)) as client:
        holder = asyncio.ensure_future(client.post("/", content=b"holds the instance"))
        await asyncio.to_thread(model.entered.wait, 10)
        late = await client.post("/", content=b"waits", headers={"x-request-timeout-ms": "50"})
        assert late.status_code == 504
        # It says which deadline passed (the one the request asked for) and where it was.
        assert late.json()["error"] == (
            "the deadline the request asked for (50 ms) passed while it was queued"
        )
        model.gate.set()
        assert (await holder).status_code == 200
        # The timed-out request was dropped, never computed.
        assert [batch for batch in model.batches if batch == ["waits"]] == []


async def test_a_bad_timeout_header_is_400() -> None:
    async with serving(app_with(EchoModel())) as client:
        response = await client.post("/", content=b"a", headers={"x-request-timeout-ms": "soon"})
    assert response.status_code == 400


async def test_overload_is_503_with_retry_after() -> None:
    model = GatedModel()
    async with serving(app_with(model, echo_config(max_queue_size=2))) as client:
        holder = asyncio.ensure_future(client.post("/", content=b"holds"))
        await asyncio.to_thread(model.entered.wait, 10)
        queued = asyncio.ensure_future(client.post("/", json={"inputs": ["q1", "q2"]}))
        for _ in range(1000):
            if (await client.get("/metrics")).text.find(
                'batching_queue_depth_items{model="echo"} 2.0'
            ) >= 0:
                break
            await asyncio.sleep(0.002)
        else:
            raise AssertionError("the two queued items never showed in the queue depth")
        refused = await client.post("/", content=b"one too many")
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "overloaded" in refused.json()["error"]
        model.gate.set()
        assert (await holder).status_code == 200
        assert (await queued).status_code == 200


async def test_a_model_that_raises_gets_500_without_internals() -> None:
    class Broken(EchoModel):
        def predict(self, inputs: list[Any]) -> list[Any]:
            raise RuntimeError("secret internal detail")

    async with serving(app_with(Broken())) as client:
        response = await client.post("/", content=b"boom")
    assert response.status_code == 500
    body = response.json()
    assert "secret" not in body["error"] and "Traceback" not in response.text


async def test_request_id_is_honoured_and_echoed() -> None:
    async with serving(app_with(EchoModel())) as client:
        response = await client.post("/", content=b"a", headers={"x-request-id": "abc-123"})
        bad = await client.post("/", content=b"", headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    assert bad.headers["x-request-id"] == "abc-123"


async def test_metrics_expose_the_batching_families() -> None:
    async with serving(app_with(EchoModel())) as client:
        await client.post("/", json={"inputs": ["a", "b"]})
        text = (await client.get("/metrics")).text
    for family in (
        "batching_requests_total",
        "batching_request_duration_seconds",
        "batching_queue_depth_items",
        "batching_queue_wait_seconds",
        "batching_batch_size_items",
        "batching_batch_compute_seconds",
        "batching_batch_release_total",
        "batching_instances_ready",
    ):
        assert family in text
    assert 'batching_requests_total{code="200",model="echo"} 1.0' in text
    assert 'batching_batch_size_items_sum{model="echo"} 2.0' in text


async def test_the_app_serves_mounted_inside_another_starlette_app() -> None:
    inference = app_with(EchoModel())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with inference.router.lifespan_context(inference):
            yield

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("host app")

    host = Starlette(routes=[Route("/", home), Mount("/ml", app=inference)], lifespan=lifespan)
    async with LifespanManager(host) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/")).text == "host app"
            for _ in range(2000):
                if (await client.get("/ml/v2/health/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError("the mounted app never became ready")
            response = await client.post("/ml/", json={"inputs": ["inside"]})
    assert response.status_code == 200
    assert response.json()["outputs"] == [{"input": "inside", "length": 6}]
