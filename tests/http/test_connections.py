"""Bounded connections, with real sockets against a real uvicorn on 127.0.0.1: slowloris (half a
request line, an idle socket, a slow body), idle keep-alive, the connection cap, a 32 MiB
POST that reads its 413, and over TLS an early answer's clean close (a close_notify)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from batching.http.connections import protocol_class
from batching.http.limits import ConnectionLimits
from batching.tls import CertificateFiles, TlsConfig
from tests.support.asgi import app_with
from tests.support.models import EchoModel
from tests.support.servers import free_port
from tests.support.tls import Pki, make_pki

LIMITS = ConnectionLimits(
    header_timeout=0.5, body_timeout=0.5, keep_alive_timeout=0.5, max_connections=8, linger=3.0
)


@contextlib.contextmanager
def bounded_server(
    limits: ConnectionLimits = LIMITS, *, tls: Pki | None = None, loop: str = "auto"
) -> Iterator[tuple[str, int]]:
    """uvicorn with ``limits`` as server.py runs it: over TLS with ``tls``'s server
    certificate, on the event loop ``loop`` (uvicorn's name: auto, asyncio, uvloop)."""
    port = free_port()
    files = None if tls is None else CertificateFiles(TlsConfig(str(tls.cert), str(tls.key)))
    config = uvicorn.Config(
        app_with(EchoModel()),
        host="127.0.0.1",
        port=port,
        lifespan="on",
        log_level="warning",
        http=protocol_class(limits),
        loop=loop,
        ssl_context_factory=None
        if files is None
        else lambda config, default: files.listening_context(),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"{'http' if tls is None else 'https'}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn never started"
            time.sleep(0.01)
        verify = True if tls is None else tls.client_context()
        with httpx.Client(base_url=url, verify=verify) as client:
            while client.get("/v2/health/ready").status_code != 200:
                assert time.monotonic() < deadline, "never ready"
                time.sleep(0.02)
        yield url, port
    finally:
        server.should_exit = True
        thread.join(30)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (EOF); a reset counts as a failure."""
    out = bytearray()
    while True:
        data = sock.recv(65536)
        if not data:
            return bytes(out)
        out.extend(data)


def status_and_body(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_half_a_request_line_gets_408_after_the_header_timeout() -> None:
    with bounded_server() as (_, port), connect(port) as sock:
        sock.sendall(b"POST / HTT")
        started = time.monotonic()
        status, body = status_and_body(read_all(sock))
        waited = time.monotonic() - started
        assert status == 408 and b"headers" in body
        assert 0.4 <= waited < 3.0


def test_an_idle_connection_that_never_sends_is_closed() -> None:
    with bounded_server() as (_, port), connect(port) as sock:
        started = time.monotonic()
        status, _ = status_and_body(read_all(sock))
        assert status == 408
        assert time.monotonic() - started < 3.0


def test_headers_sent_slowly_within_the_timeout_are_served() -> None:
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with bounded_server() as (_, port), connect(port) as sock:
        for part in (request[:10], request[10:30], request[30:]):
            sock.sendall(part)
            time.sleep(0.1)
        status, _ = status_and_body(read_all(sock))
        assert status == 200


def test_a_body_that_stops_arriving_gets_408_after_the_body_timeout() -> None:
    with bounded_server() as (_, port), connect(port) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
        )
        sock.sendall(b"0123456789")
        started = time.monotonic()
        status, body = status_and_body(read_all(sock))
        assert status == 408 and b"body" in body
        assert 0.4 <= time.monotonic() - started < 3.0


def test_a_body_arriving_in_slow_pieces_within_the_timeout_is_served() -> None:
    with bounded_server() as (_, port), connect(port) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n"
            b"Connection: close\r\n\r\n"
        )
        for part in (b"he", b"ll", b"o!"):
            time.sleep(0.3)  # each gap under the 0.5 s body timeout, the whole over it
            sock.sendall(part)
        status, _ = status_and_body(read_all(sock))
        assert status == 200


def test_an_idle_keep_alive_connection_is_closed_after_its_timeout() -> None:
    with bounded_server() as (_, port), connect(port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        raw = read_all(sock)  # the answer, then EOF when the keep-alive timer fires
        assert status_and_body(raw)[0] == 200
        assert 0.4 <= time.monotonic() - started < 3.0


@pytest.mark.parametrize("close", [True, False])
def test_a_32_mib_post_reads_its_413_with_the_json_reason(close: bool) -> None:
    size = 32 << 20
    headers = (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n" % (size, b"Connection: close\r\n" if close else b"")
    )
    with bounded_server() as (_, port), connect(port) as sock:
        sock.sendall(headers)
        chunk = b"x" * (1 << 20)
        sent = 0
        try:
            # As a simple client does: the whole body first, then read the answer.
            while sent < size:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may stop reading once the linger ends; the answer is there
        status, body = status_and_body(read_all(sock))
        assert status == 413
        assert "limit" in json.loads(body)["error"]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_over_tls_an_early_answer_ends_in_a_close_notify_once_the_body_is_in(
    loop: str, tmp_path: Path
) -> None:
    # A linger far longer than the socket's timeout: only the body's end can close in time.
    limits = dataclasses.replace(LIMITS, linger=120.0)
    pki = make_pki(tmp_path)
    size = 2 << 20
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
    with (
        bounded_server(limits, tls=pki, loop=loop) as (_, port),
        connect(port) as raw,
        # A ragged end (no close_notify) raises SSLEOFError instead of reading as b"".
        pki.client_context().wrap_socket(
            raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False
        ) as sock,
    ):
        sock.sendall(head % size + b"x" * 65536)
        answer = bytearray()
        while b"}" not in answer:  # the 413's head and its JSON body, before the body's rest
            piece = sock.recv(65536)
            assert piece, bytes(answer)
            answer += piece
        status, body = status_and_body(bytes(answer))
        assert status == 413 and b"connection: close" in answer.lower()
        assert "limit" in json.loads(body)["error"]
        # A client that ignores connection: close sends its next request on the same
        # connection: it is not served; the connection ends cleanly instead.
        sock.sendall(b"x" * (size - 65536) + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_all(sock) == b""


def test_a_connection_beyond_the_cap_gets_a_fast_503_and_the_open_ones_are_served() -> None:
    with bounded_server(
        ConnectionLimits(header_timeout=30, max_connections=4, keep_alive_timeout=30)
    ) as (url, port):
        with httpx.Client(base_url=url) as client:
            assert client.get("/v2/health/live").status_code == 200  # one kept-alive
            idle = [connect(port) for _ in range(3)]
            time.sleep(0.2)  # let the server accept them
            with connect(port) as extra:
                started = time.monotonic()
                extra.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
                status, body = status_and_body(read_all(extra))
                assert status == 503 and b"too many connections" in body
                assert time.monotonic() - started < 2.0
            # The connections already open are not turned away.
            assert client.get("/v2/health/live").status_code == 200
            for sock in idle:
                sock.close()
            time.sleep(0.2)
            with httpx.Client(base_url=url) as fresh:
                assert fresh.get("/v2/health/live").status_code == 200


def test_connection_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="header_timeout"):
        ConnectionLimits(header_timeout=-1)
    with pytest.raises(ValueError, match="max_connections"):
        ConnectionLimits(max_connections=-1)


def test_the_connection_flags_and_their_environment_twins() -> None:
    from batching.runtime.cpus import CpuBudget
    from batching.settings.cli import parse_settings

    budget = CpuBudget(affinity=2, quota=None)
    defaults = parse_settings([], {}, cpu_budget=budget)
    assert defaults.connections == ConnectionLimits()
    assert defaults.malloc == "auto"
    settings = parse_settings(
        ["--header-timeout-s", "3", "--body-timeout-s", "4", "--keep-alive-timeout-s", "1.5"],
        {"BATCHING_MAX_CONNECTIONS": "100", "BATCHING_MALLOC": "off"},
        cpu_budget=budget,
    )
    assert settings.connections == ConnectionLimits(
        header_timeout=3, body_timeout=4, keep_alive_timeout=1.5, max_connections=100
    )
    assert settings.malloc == "off"
    with pytest.raises(SystemExit):
        parse_settings(["--max-connections", "-1"], {}, cpu_budget=budget)


def test_creating_an_app_leaves_the_allocator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import batching.runtime.allocator as allocator

    called: list[str] = []
    monkeypatch.setattr(allocator, "tune_malloc", lambda *a, **k: called.append("tuned"))
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    app_with(EchoModel())
    assert called == []
    import os

    assert "MALLOC_ARENA_MAX" not in os.environ


def test_tune_malloc_on_glibc_sets_the_variables_child_processes_inherit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from batching.runtime.allocator import ARENA_MAX, MMAP_THRESHOLD, trim, tune_malloc

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    if not tune_malloc():
        pytest.skip("not glibc")
    assert os.environ["MALLOC_ARENA_MAX"] == str(ARENA_MAX)
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(MMAP_THRESHOLD)
    trim()
