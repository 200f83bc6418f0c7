"""Property-based: random bodies, content types, encodings and headers at every endpoint
never get a 5xx, never hang, and a good request still succeeds afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.models import EchoModel

ENDPOINTS = [
    ("POST", "/"),
    ("POST", "/models/echo"),
    ("POST", "/models/other"),
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/metrics"),
    ("POST", "/v2/models/echo/infer"),
    ("POST", "/v2/models/echo/versions/1/infer"),
    ("GET", "/v2/models/echo"),
    ("GET", "/v2/models/echo/ready"),
    ("GET", "/v2"),
    ("POST", "/v2/repository/index"),
    ("PUT", "/"),
    ("DELETE", "/v2/models/echo"),
]

CONTENT_TYPES = [
    "text/plain",
    "text/plain; charset=latin-1",
    "application/json",
    "application/json; charset=utf-8",
    "application/octet-stream",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    "garbage/\x7f",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda text: text.encode("utf-8")),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.builds(lambda inputs: json.dumps({"inputs": inputs}).encode(), json_values),
    st.builds(
        lambda data, dt, shape: json.dumps(
            {"inputs": [{"name": "text", "datatype": dt, "shape": shape, "data": data}]}
        ).encode(),
        json_values,
        st.sampled_from(["BYTES", "FP32", "INT64", "BOOL", "nonsense"]),
        st.lists(st.integers(-2, 5), max_size=3),
    ),
)
header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    config = ModelConfig(
        name="echo", batching=BatchingConfig(max_items_per_request=64, timeout=5.0)
    )
    app = create_app(config, builder=lambda _: EchoModel(), max_body_bytes=4096)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        for _ in range(1000):
            if test_client.get("/v2/health/ready").status_code == 200:
                break
        yield test_client


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    body=bodies,
    content_type=st.sampled_from(CONTENT_TYPES),
    timeout_header=st.none() | header_values,
    header_length=st.none() | header_values | st.integers(-5, 400).map(str),
)
def test_random_requests_never_get_a_5xx(
    client: TestClient,
    endpoint: tuple[str, str],
    body: bytes,
    content_type: str,
    timeout_header: str | None,
    header_length: str | None,
) -> None:
    method, path = endpoint
    headers = {"content-type": content_type} if content_type else {}
    if timeout_header is not None:
        headers["x-request-timeout-ms"] = timeout_header
    if header_length is not None:
        headers["inference-header-content-length"] = header_length
    response = client.request(method, path, content=body, headers=headers)
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        assert isinstance(response.json()["error"], str)
    good = client.post("/", json={"inputs": ["still fine"]})
    assert good.status_code == 200
    assert good.json()["outputs"][0]["input"] == "still fine"
