"""HTTP limits that cover everything, with real sockets against a real uvicorn on 127.0.0.1:
header sections over the byte or line limit get 431 before they are read whole, a body that
trickles past its overall deadline gets 408, HTTP/1.1 needs exactly one Host, redirects never
name the client's Host, and the probes answer while idle sockets hold every connection slot."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from batching.http.limits import ConnectionLimits
from batching.http.redirects import relative_location
from tests.http.test_connections import bounded_server, connect, read_all, status_and_body
from tests.support.asgi import app_with, serving
from tests.support.models import EchoModel

LIMITS = ConnectionLimits(
    header_timeout=30,
    body_timeout=0.5,
    body_deadline=1.0,
    keep_alive_timeout=30,
    max_connections=16,
    linger=0.5,
    max_header_bytes=4096,
    max_header_count=20,
    probe_connections=4,
)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with bounded_server(LIMITS) as (_, bound):
        yield bound


def ask(port: int, raw: bytes) -> tuple[int, bytes]:
    with connect(port) as sock:
        sock.sendall(raw)
        return status_and_body(read_all(sock))


def test_a_header_section_over_the_byte_limit_gets_431_before_it_ends(port: int) -> None:
    with connect(port) as sock:
        # Never finished: a server that waited for the end would answer only at the header
        # timeout (30 s, with 408), one that buffered it all never.
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192)
        started = time.monotonic()
        status, body = status_and_body(read_all(sock))
        assert status == 431 and b"too large" in body
        assert time.monotonic() - started < 5


def test_a_header_section_fed_slowly_past_the_limit_gets_431(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(64):
                sock.sendall(b"X-Pad: " + b"b" * 200 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = read_all(sock)
    status, _ = status_and_body(raw)
    assert status == 431 and b"connection: close" in raw


def test_a_header_section_under_the_limit_is_served(port: int) -> None:
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    pad = b"X-Pad: " + b"c" * (3500 - len(head)) + b"\r\n"
    assert ask(port, head + pad + b"\r\n")[0] == 200


def test_too_many_header_lines_get_431(port: int) -> None:
    lines = b"".join(b"X-%d: v\r\n" % index for index in range(25))
    status, body = ask(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    assert status == 431 and b"too many" in body


def test_a_body_trickling_past_the_deadline_gets_408(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
        )
        started = time.monotonic()
        try:
            # Every gap under the 0.5 s body timeout; the whole far over the 1 s deadline.
            for _ in range(20):
                sock.sendall(b"x")
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, body = status_and_body(read_all(sock))
        assert status == 408 and b"deadline" in body
        assert time.monotonic() - started < 4.5


@pytest.mark.parametrize("hosts", [b"", b"Host: a\r\nHost: b\r\n"], ids=["no Host", "two Hosts"])
def test_http_1_1_without_exactly_one_host_is_400(port: int, hosts: bytes) -> None:
    status, body = ask(port, b"GET /v2/health/live HTTP/1.1\r\n" + hosts + b"\r\n")
    assert status == 400 and b"Host" in body


def test_http_1_0_may_omit_host(port: int) -> None:
    assert ask(port, b"GET /v2/health/live HTTP/1.0\r\n\r\n")[0] == 200


def test_the_probes_answer_while_idle_sockets_hold_every_slot(port: int) -> None:
    url = f"http://127.0.0.1:{port}"
    idle: list[socket.socket] = []
    try:
        # Every slot, then every reserved slot, held by sockets that never send a byte.
        for _ in range(LIMITS.max_connections + LIMITS.probe_connections):
            idle.append(connect(port))
        # No wait needed: the kernel queues connections in the order they were made and the
        # server accepts them in that order, so the probes below come after every idle one.
        for path in ("/v2/health/live", "/v2/health/ready"):
            with httpx.Client(base_url=url) as client:
                assert client.get(path).status_code == 200
        # A reserved slot serves probes only.
        status, body = ask(port, b"GET /v2/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and b"too many connections" in body
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.anyio
async def test_a_trailing_slash_redirect_never_echoes_the_host() -> None:
    async with serving(app_with(EchoModel())) as client:
        response = await client.get(
            "/v2/health/live/", headers={"host": "evil.example"}, follow_redirects=False
        )
    assert response.status_code == 307
    assert response.headers["location"] == "/v2/health/live"


def test_relative_location_keeps_path_and_query_only() -> None:
    assert relative_location(b"http://evil.example/x/?q=1") == b"/x/?q=1"
    assert relative_location(b"http://evil.example//other.example/") == b"/other.example/"
    assert relative_location(b"http://evil.example") == b"/"


def test_the_limits_flags_and_their_environment_twins() -> None:
    from batching.runtime.cpus import CpuBudget
    from batching.settings.cli import parse_settings

    budget = CpuBudget(affinity=2, quota=None)
    settings = parse_settings(
        ["--max-header-bytes", "8192", "--body-deadline-s", "12"],
        {"BATCHING_MAX_HEADER_COUNT": "50", "BATCHING_PROBE_CONNECTIONS": "2"},
        cpu_budget=budget,
    )
    assert settings.connections == ConnectionLimits(
        max_header_bytes=8192, body_deadline=12, max_header_count=50, probe_connections=2
    )
    defaults = ConnectionLimits()
    assert (defaults.max_header_bytes, defaults.max_header_count) == (65536, 100)
    for bad in (["--max-header-bytes", "100"], ["--body-deadline-s", "-1"]):
        with pytest.raises(SystemExit):
            parse_settings(bad, {}, cpu_budget=budget)
