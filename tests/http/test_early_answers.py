"""Answers sent before the request was all read (a 413, a 401, a 431) end their connection in
the open, over TLS and plain HTTP alike: the answer says ``connection: close``, and the same
client session's next request goes out on a new connection and is served.

Against a real ``python server.py`` on 127.0.0.1 (``--api-key``, with and without
``--ssl-certfile``), with the clients users pool connections with: ``httpx.Client`` and
``requests.Session``. A body's rest is sent only once the server has logged its answer to the
request (``--log-level debug``), so the answer is early on every run, not on lucky ones.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import httpx
import pytest
import requests

from tests.support.server_process import ServerProcess
from tests.support.tls import Pki, make_pki

pytestmark = pytest.mark.slow

KEY = "sk-early-answers-5c2e9a"
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}
PIECE = 1 << 16
#: One more than --max-body-bytes' default.
OVER_THE_LIMIT = (1 << 20) + 1


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def servers(pki: Pki) -> Iterator[dict[str, ServerProcess]]:
    flags = ["--api-key", KEY, "--log-level", "debug"]
    tls = ["--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key)]
    started: dict[str, ServerProcess] = {}
    try:
        started["plain"] = ServerProcess(*flags)
        started["tls"] = ServerProcess(*flags, *tls)
        yield started
    finally:
        for server in started.values():
            server.stop()


class GatedBody:
    """A body sent as a client sends one the server answers early: ``first`` bytes, then,
    once ``answered()`` returns (the server has answered), the rest, in 64 KiB pieces. Its
    length is announced (``len``); ``iter()`` of it is the same body with no length."""

    def __init__(self, size: int, first: int, answered: Callable[[], object]) -> None:
        self.size = size
        self.first = first
        self.answered = answered

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, self.first, PIECE):
            yield b"x" * min(PIECE, self.first - start)
        self.answered()
        for start in range(self.first, self.size, PIECE):
            yield b"x" * min(PIECE, self.size - start)


@dataclasses.dataclass(frozen=True)
class Ask:
    """One request: what a client session sends."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes | Iterable[bytes] | None = None


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    connection: str | None


def early_ask(kind: str, server: ServerProcess, request_id: str) -> Ask:
    """The request of ``kind`` whose answer the server sends before reading all of it."""

    def answered(status: int) -> Callable[[], object]:
        return lambda: server.wait_for(f"request {request_id} answered {status}")

    plain = {"Content-Type": "text/plain", "X-Request-ID": request_id}
    if kind == "413, its length announced":
        body = GatedBody(OVER_THE_LIMIT + 100_000, PIECE, answered(413))
        return Ask("POST", "/", {**plain, **AUTHORIZED, "Content-Length": str(len(body))}, body)
    if kind == "413, its body streamed":
        # Chunked: the server counts the body as it reads, past the limit.
        body = GatedBody(OVER_THE_LIMIT + 2 * PIECE, OVER_THE_LIMIT + PIECE, answered(413))
        return Ask("POST", "/", {**plain, **AUTHORIZED}, iter(body))
    if kind == "401":
        body = GatedBody(4096, 1024, answered(401))
        return Ask("POST", "/", {**plain, "Content-Length": str(len(body))}, body)
    assert kind == "431"
    big = {"X-Big": "a" * (70 << 10)}  # over --max-header-bytes' 64 KiB default
    return Ask("GET", "/v2/models/vectors", {**AUTHORIZED, **big})


def valid_ask() -> Ask:
    """A request that is served: a POST, which no client resends on its own."""
    return Ask("POST", "/", {**AUTHORIZED, "Content-Type": "text/plain"}, b"ab")


class HttpxSession:
    """An ``httpx.Client`` and its connection pool."""

    def __init__(self, base: str, pki: Pki) -> None:
        self.base = base
        self.client = httpx.Client(verify=pki.client_context(), timeout=30)

    def ask(self, ask: Ask) -> Answer:
        body: Any = ask.body
        answer = self.client.request(
            ask.method, self.base + ask.path, headers=dict(ask.headers), content=body
        )
        return Answer(answer.status_code, answer.headers.get("connection"))

    def close(self) -> None:
        self.client.close()


class RequestsSession:
    """A ``requests.Session`` and its connection pool."""

    def __init__(self, base: str, pki: Pki) -> None:
        self.base = base
        self.session = requests.Session()
        # Per request: REQUESTS_CA_BUNDLE, where set, would win over the session's own.
        self.ca = str(pki.ca)

    def ask(self, ask: Ask) -> Answer:
        # requests announces the length itself (len), or streams a body without one.
        headers = {k: v for k, v in ask.headers.items() if k != "Content-Length"}
        reply = self.session.request(
            ask.method,
            self.base + ask.path,
            headers=headers,
            data=ask.body,
            verify=self.ca,
            timeout=30,
        )
        return Answer(reply.status_code, reply.headers.get("connection"))

    def close(self) -> None:
        self.session.close()


SESSIONS: dict[str, type[HttpxSession | RequestsSession]] = {
    "httpx": HttpxSession,
    "requests": RequestsSession,
}


KINDS = {
    "413, its length announced": 413,
    "413, its body streamed": 413,
    "401": 401,
    "431": 431,
}
CASES = list(itertools.product(["tls", "plain"], SESSIONS, KINDS))


@pytest.mark.parametrize(
    ("transport", "client", "kind"), CASES, ids=["-".join(case) for case in CASES]
)
def test_after_an_early_answer_the_same_session_s_next_request_is_served(
    transport: str, client: str, kind: str, servers: dict[str, ServerProcess], pki: Pki
) -> None:
    server = servers[transport]
    scheme = "https" if transport == "tls" else "http"
    session = SESSIONS[client](f"{scheme}://127.0.0.1:{server.port}", pki)
    request_id = uuid.uuid4().hex
    try:
        assert session.ask(valid_ask()).status == 200  # a kept-alive connection in the pool
        early = session.ask(early_ask(kind, server, request_id))
        after = [session.ask(valid_ask()).status for _ in range(2)]
        assert early == Answer(KINDS[kind], "close")
        assert after == [200, 200]
    finally:
        session.close()
