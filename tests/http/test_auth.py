"""API keys, CORS and the metrics listener, in-process: the key store (digests, constant-time
check over every key, the key file re-read when it changes), the HTTP middleware on every route
the app serves, the gRPC interceptor on every RPC of the service, and the flags."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from starlette.routing import Route
from tritonclient.grpc import service_pb2

from batching import create_app
from batching import keys as keys_module
from batching.keys import ApiKeyError, ApiKeys, credential_of, split_keys
from batching.settings.cli import parse_settings
from tests.support.asgi import app_with, echo_config, serving
from tests.support.grpc_door import serving_grpc
from tests.support.metrics import sample
from tests.support.models import EchoModel

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789abcdef"
OTHER = "sk-other-fedcba9876543210"
INFER = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, as kubelet swaps a Secret's files."""
    temporary = path.with_suffix(".new")
    temporary.write_text(text)
    os.replace(temporary, path)


# The key store ------------------------------------------------------------------------------


def test_keys_are_checked_against_every_key_given_and_in_the_file(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(f"\n  {OTHER}  \n\nsk-third\n")
    keys = ApiKeys([KEY], file)
    assert keys.count == 3
    assert keys.accepts(KEY) and keys.accepts(OTHER) and keys.accepts("sk-third")
    assert not keys.accepts(None)
    assert not keys.accepts("")
    assert not keys.accepts(KEY[:-1])
    assert not keys.accepts(KEY + "x")


def test_only_digests_are_kept_never_a_keys_text() -> None:
    keys = ApiKeys([KEY])
    kept = repr(vars(keys)) if hasattr(keys, "__dict__") else repr(keys.__getstate__())
    assert KEY not in kept
    assert keys._fixed == [hashlib.sha256(KEY.encode()).digest()]


def test_the_comparison_runs_over_every_key_with_no_early_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = keys_module.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    keys = ApiKeys([KEY, OTHER, "sk-third"])
    monkeypatch.setattr(keys_module.hmac, "compare_digest", counting)
    assert keys.accepts(KEY)  # the first key matches; the other two are compared all the same
    assert len(calls) == 3
    calls.clear()
    assert not keys.accepts("wrong")
    assert len(calls) == 3
    assert all(len(a) == len(b) == 32 for a, b in calls)  # digests, of equal length


def test_the_key_file_is_re_read_when_it_changes_at_most_once_an_interval(
    tmp_path: Path,
) -> None:
    file = tmp_path / "keys"
    file.write_text(KEY)
    clock = Clock()
    keys = ApiKeys([], file, clock=clock, recheck_interval=1.0)
    write(file, OTHER)
    clock.now += 0.5
    assert keys.accepts(KEY) and not keys.accepts(OTHER)  # not looked at again yet
    clock.now += 0.6
    assert keys.accepts(OTHER) and not keys.accepts(KEY)


def test_a_secret_rotated_by_kubelets_symlink_swap_is_seen(tmp_path: Path) -> None:
    # kubelet's layout: keys -> ..data/keys, ..data -> ..2026_01_01; a rotation writes a new
    # timestamped folder and swaps ..data atomically.
    first, second = tmp_path / "..2026_01_01", tmp_path / "..2026_01_02"
    first.mkdir()
    second.mkdir()
    (first / "keys").write_text(KEY + "\n")
    (second / "keys").write_text(OTHER + "\n")
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "keys").symlink_to("..data/keys")
    clock = Clock()
    keys = ApiKeys([], tmp_path / "keys", clock=clock)
    assert keys.accepts(KEY)
    (tmp_path / "..data_tmp").symlink_to(second.name)
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.now += 1.0
    assert keys.accepts(OTHER) and not keys.accepts(KEY)


def test_a_key_file_that_becomes_empty_or_goes_keeps_the_keys_read_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "keys"
    file.write_text(KEY)
    clock = Clock()
    keys = ApiKeys([], file, clock=clock)
    write(file, "\n")
    clock.now += 1.0
    assert keys.accepts(KEY)
    file.unlink()
    clock.now += 1.0
    assert keys.accepts(KEY)
    assert "keeping the keys read last" in caplog.text
    assert KEY not in caplog.text


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_key_file_at_start_is_an_error(tmp_path: Path, text: str) -> None:
    file = tmp_path / "keys"
    file.write_text(text)
    with pytest.raises(ApiKeyError, match="holds no key"):
        ApiKeys([], file)


def test_a_missing_key_file_or_a_malformed_key_is_an_error_that_never_shows_the_key(
    tmp_path: Path,
) -> None:
    with pytest.raises(ApiKeyError, match="cannot be read"):
        ApiKeys([], tmp_path / "absent")
    with pytest.raises(ApiKeyError) as spaced:
        ApiKeys(["two words"])
    assert "two words" not in str(spaced.value)
    with pytest.raises(ApiKeyError):
        ApiKeys([])


def test_the_credential_is_the_bearer_token_else_the_api_key_header() -> None:
    assert credential_of([("authorization", f"Bearer {KEY}")]) == KEY
    assert credential_of([("authorization", f"bearer  {KEY} ")]) == KEY
    assert credential_of([("api-key", KEY)]) == KEY
    assert credential_of([("authorization", "Basic dTpw"), ("api-key", KEY)]) == KEY
    assert credential_of([("authorization", "Bearer a"), ("authorization", "Bearer b")]) == "a"
    assert credential_of([("authorization", "Bearer")]) is None
    assert credential_of([]) is None
    assert split_keys(" a, b ,,c ") == ["a", "b", "c"]


# The HTTP doors -----------------------------------------------------------------------------


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: "1" if "version" in m.group(0) else "echo", path)


def every_route(app: Any) -> list[tuple[str, str]]:
    found = []
    for route in app.routes:
        assert isinstance(route, Route)
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                found.append((method, concrete(route.path)))
    return found


OPEN = {"/v2/health/live", "/v2/health/ready", "/metrics"}


async def test_every_route_but_the_probes_and_metrics_needs_a_key() -> None:
    model = EchoModel()
    app = app_with(model, api_keys=ApiKeys([KEY]))
    routes = every_route(app)
    assert {path for _, path in routes} >= {
        "/v2",
        "/v2/models/echo/infer",
        "/v1/embeddings",
        "/v1/models",
        "/v1/rerank",
        "/",
        "/models/echo",
    }
    async with serving(app) as client:
        for method, path in routes:
            batches = len(model.batches)
            for headers in ({}, {"authorization": f"Bearer {OTHER}"}, {"api-key": OTHER}):
                answer = await client.request(method, path, headers=headers, json=INFER)
                if path in OPEN:
                    assert answer.status_code != 401, (method, path)
                    continue
                assert answer.status_code == 401, (method, path, headers)
                assert answer.headers["www-authenticate"].startswith("Bearer")
                assert answer.headers["content-type"] == "application/json"
                assert KEY not in answer.text and OTHER not in answer.text
                error = answer.json()["error"]
                if path.startswith("/v1/"):
                    assert error["code"] == "invalid_api_key"
                    assert error["type"] == "invalid_request_error"
                else:
                    assert isinstance(error, str)
            # A refused request costs no model time.
            assert len(model.batches) == batches, (method, path)
            with_key = await client.request(
                method, path, headers={"authorization": f"Bearer {KEY}"}, json=INFER
            )
            assert with_key.status_code != 401, (method, path)
        metrics = (await client.get("/metrics")).text
    assert model.batches  # the keyed calls did reach the model
    refused = 3 * sum(1 for _, path in routes if path not in OPEN)
    assert sample(metrics, "batching_unauthorized_total", door="http") == refused


async def test_a_wrong_key_runs_no_batch_and_is_counted_with_the_door_only() -> None:
    model = EchoModel()
    app = app_with(model, api_keys=ApiKeys([KEY]))
    async with serving(app) as client:
        for _ in range(5):
            refused = await client.post(
                "/v2/models/echo/infer", json=INFER, headers={"authorization": "Bearer nope"}
            )
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        missing = await client.post("/v2/models/echo/infer", json=INFER)
        assert missing.headers["www-authenticate"] == "Bearer"
        assert model.batches == []
        answered = await client.post("/v2/models/echo/infer", json=INFER, headers={"api-key": KEY})
        assert answered.status_code == 200
        assert model.batches == [["hi"]]
        metrics = (await client.get("/metrics")).text
    lines = [line for line in metrics.splitlines() if line.startswith("batching_unauthorized")]
    assert 'batching_unauthorized_total{door="http"} 6.0' in lines
    assert all("nope" not in line for line in lines)


async def test_the_check_reads_the_scope_path_not_a_url_rebuilt_from_host() -> None:
    # BadHost (CVE-2026-48746): a Host that makes request.url.path look like an open path.
    model = EchoModel()
    app = app_with(model, api_keys=ApiKeys([KEY]))
    async with serving(app) as client:
        for host in ("localhost/v2/health/live?", "localhost/metrics#", "x/v2/health/ready?a="):
            answer = await client.post("/v2/models/echo/infer", json=INFER, headers={"host": host})
            assert answer.status_code == 401, host
        # Open paths are matched exactly: another spelling of one needs a key.
        assert (await client.get("//v2/health/live")).status_code == 401
        assert (await client.get("/v2/health/live/")).status_code == 401
    assert model.batches == []


async def test_without_keys_every_route_stays_open() -> None:
    async with serving(app_with(EchoModel())) as client:
        assert (await client.post("/v2/models/echo/infer", json=INFER)).status_code == 200
        assert (await client.get("/v1/models")).status_code == 200


async def test_a_rotated_key_file_takes_effect_without_a_restart(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(KEY)
    clock = Clock()
    app = app_with(EchoModel(), api_keys=ApiKeys([], file, clock=clock))
    async with serving(app) as client:
        assert (await client.get("/v2", headers={"api-key": KEY})).status_code == 200
        write(file, f"{OTHER}\n")
        clock.now += 1.0
        assert (await client.get("/v2", headers={"api-key": OTHER})).status_code == 200
        assert (await client.get("/v2", headers={"api-key": KEY})).status_code == 401


# The metrics listener and CORS --------------------------------------------------------------


async def test_with_a_metrics_port_metrics_and_probes_live_there_only() -> None:
    app = app_with(EchoModel(), api_keys=ApiKeys([KEY]), metrics_port=9100)
    async with serving(app) as main:
        metrics = httpx.AsyncClient(transport=main._transport, base_url="http://test:9100")
        async with metrics:
            assert (await metrics.get("/metrics")).status_code == 200
            assert (await metrics.get("/v2/health/live")).status_code == 200
            assert (await metrics.get("/v2/health/ready")).status_code == 200
            for path in ("/v2", "/v2/models/echo", "/v1/models"):
                answer = await metrics.get(path, headers={"api-key": KEY})
                assert answer.status_code == 404, path
            assert (await metrics.post("/v2/models/echo/infer", json=INFER)).status_code == 404
        assert (await main.get("/metrics")).status_code == 404
        assert (await main.get("/metrics", headers={"api-key": KEY})).status_code == 404
        assert (await main.get("/v2/health/ready")).status_code == 200
        assert (await main.get("/v2", headers={"api-key": KEY})).status_code == 200


PREFLIGHT = {
    "origin": "https://app.example.com",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
}


async def test_cors_is_off_by_default() -> None:
    async with serving(app_with(EchoModel(), api_keys=ApiKeys([KEY]))) as client:
        preflight = await client.options("/v1/embeddings", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in preflight.headers
        answer = await client.get("/v2", headers={"origin": PREFLIGHT["origin"], "api-key": KEY})
        assert "access-control-allow-origin" not in answer.headers


async def test_cors_admits_the_listed_origins_only_and_a_preflight_needs_no_key() -> None:
    app = app_with(
        EchoModel(), api_keys=ApiKeys([KEY]), cors_allow_origins=["https://app.example.com"]
    )
    async with serving(app) as client:
        preflight = await client.options("/v1/embeddings", headers=PREFLIGHT)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example.com"
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        assert "access-control-allow-credentials" not in preflight.headers
        # A refusal carries the CORS headers, so the page can read why.
        refused = await client.get("/v2", headers={"origin": PREFLIGHT["origin"]})
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == "https://app.example.com"
        stranger = await client.options(
            "/v1/embeddings", headers={**PREFLIGHT, "origin": "https://evil.example"}
        )
        assert "access-control-allow-origin" not in stranger.headers
        other = await client.get("/v2", headers={"origin": "https://evil.example", "api-key": KEY})
        assert other.status_code == 200
        assert "access-control-allow-origin" not in other.headers


# The gRPC door ------------------------------------------------------------------------------

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
OPEN_RPCS = {"ServerLive", "ServerReady"}


def _call(channel: grpc.aio.Channel, method: Any) -> Callable[..., Any]:
    path = f"/{SERVICE.full_name}/{method.name}"
    serializer = lambda message: message.SerializeToString()  # noqa: E731
    if method.client_streaming:
        return channel.stream_stream(path, request_serializer=serializer)
    return channel.unary_unary(path, request_serializer=serializer)


async def _code(channel: grpc.aio.Channel, method: Any, metadata: Any) -> grpc.StatusCode:
    request = getattr(service_pb2, method.input_type.name)()
    fields = method.input_type.fields_by_name
    for field in ("name", "model_name"):
        if field in fields:
            setattr(request, field, "echo")
    call = _call(channel, method)
    try:
        if method.client_streaming:
            async for _ in call(iter([request]), metadata=metadata):
                pass
        else:
            await call(request, metadata=metadata)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_every_rpc_but_the_health_checks_needs_a_key() -> None:
    model = EchoModel()
    async with serving_grpc(echo_config(), model, api_keys=ApiKeys([KEY])) as (http, target):
        async with grpc.aio.insecure_channel(target) as channel:
            for method in SERVICE.methods:
                for metadata in ((), (("authorization", f"Bearer {OTHER}"),)):
                    code = await _code(channel, method, metadata)
                    if method.name in OPEN_RPCS:
                        assert code == grpc.StatusCode.OK, method.name
                    else:
                        assert code == grpc.StatusCode.UNAUTHENTICATED, method.name
                keyed = await _code(channel, method, (("authorization", f"Bearer {KEY}"),))
                assert keyed != grpc.StatusCode.UNAUTHENTICATED, method.name
            unknown = channel.unary_unary("/inference.GRPCInferenceService/Nothing")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unknown(b"")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metrics = (await http.get("/metrics")).text
    assert model.batches == []  # the one keyed ModelInfer carries no input
    refusals = 2 * (len(SERVICE.methods) - len(OPEN_RPCS)) + 1
    assert sample(metrics, "batching_unauthorized_total", door="grpc") == refusals


# The flags ----------------------------------------------------------------------------------


def test_keys_come_from_repeated_flags_or_a_comma_list_in_the_variable(tmp_path: Path) -> None:
    settings = parse_settings(["--api-key", "a1", "--api-key", "b2"], {})
    assert settings.api_keys is not None and settings.api_keys.count == 2
    settings = parse_settings([], {"BATCHING_API_KEY": "a1, b2,c3"})
    assert settings.api_keys is not None and settings.api_keys.count == 3
    # A flag given replaces the variable, as every other flag does.
    settings = parse_settings(["--api-key", "z"], {"BATCHING_API_KEY": "a1,b2"})
    assert settings.api_keys is not None and settings.api_keys.accepts("z")
    assert not settings.api_keys.accepts("a1")
    file = tmp_path / "keys"
    file.write_text("f1\nf2\n")
    settings = parse_settings([], {"BATCHING_API_KEY_FILE": str(file)})
    assert settings.api_keys is not None and settings.api_keys.accepts("f2")
    assert parse_settings([], {}).api_keys is None


def test_an_empty_key_file_stops_the_start_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "keys"
    file.write_text("\n")
    with pytest.raises(SystemExit) as stopped:
        parse_settings(["--api-key-file", str(file)], {})
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"server.py: error: --api-key-file {file}: holds no key (one key per line)"
    ]


def test_cors_origins_and_the_metrics_port_are_checked() -> None:
    assert parse_settings([], {}).cors_allow_origins == ()
    settings = parse_settings(
        ["--cors-allow-origin", "https://a.example", "--cors-allow-origin", "http://b:8080"], {}
    )
    assert settings.cors_allow_origins == ("https://a.example", "http://b:8080")
    assert parse_settings([], {"BATCHING_CORS_ALLOW_ORIGIN": "*"}).cors_allow_origins == ("*",)
    for bad in ("a.example", "https://a.example/path", "ftp://a.example"):
        with pytest.raises(SystemExit):
            parse_settings(["--cors-allow-origin", bad], {})
    assert parse_settings(["--metrics-port", "9100"], {}).metrics_port == 9100
    assert parse_settings([], {}).metrics_port is None
    for bad in ("0", "8000", "8001", "70000"):
        with pytest.raises(SystemExit):
            parse_settings(["--metrics-port", bad], {})


def test_create_app_without_keys_adds_no_check() -> None:
    app = create_app(echo_config(), builder=lambda _: EchoModel())
    assert not any("ApiKey" in str(m.cls) for m in app.user_middleware)
