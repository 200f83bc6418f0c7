"""Early resends: a refused request sent again at once on the same connection is held until the
queue could take it, so clients that ignore Retry-After cannot spend the server's CPU on
refusals. Real sockets against a real uvicorn on 127.0.0.1; the refusals' hold comes from a
small ASGI app, or from the batching app's own admission."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from batching.core.admission import MIN_HOLD, hold_for
from batching.errors import Overloaded
from batching.http.connections import ARRIVED_KEY, HOLD_KEY, hold_resends, protocol_class
from batching.http.limits import ConnectionLimits
from tests.support.asgi import app_with, echo_config, serving
from tests.support.models import GatedModel
from tests.support.servers import free_port

#: Long enough that a request started "at once" cannot be mistaken for a held one.
HOLD = 0.4


class RefusingApp:
    """Answers ``POST /refuse`` with a 503 that asks for ``HOLD`` seconds of hold, anything
    else with 200; records when each request reached it and when each answer was sent."""

    def __init__(self) -> None:
        self.started: list[tuple[bytes, float]] = []
        self.answered: list[float] = []
        #: Per request: the loop's time its connection stamped as its arrival, and the
        #: loop's time it reached the app.
        self.arrivals: list[tuple[object, float]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.started.append((body, time.monotonic()))
        self.arrivals.append((scope.get(ARRIVED_KEY), asyncio.get_running_loop().time()))
        refuse = scope["path"] == "/refuse"
        if refuse:
            hold_resends(scope, Overloaded("busy", retry_after=1.0, hold=HOLD))
        status = 503 if refuse else 200
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", b"2"), (b"retry-after", b"1")],
            }
        )
        self.answered.append(time.monotonic())
        await send({"type": "http.response.body", "body": b"{}"})


@contextlib.contextmanager
def running(app: Any) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        http=protocol_class(ConnectionLimits()),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn never started"
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


def post(sock: socket.socket, path: str, body: bytes) -> int:
    """One keep-alive request on ``sock``; the answer's status."""
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    raw = b""
    while b"\r\n\r\n" not in raw or not raw.endswith(b"{}"):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        raw += chunk
    return int(raw.split(b" ", 2)[1])


def test_the_same_request_sent_again_at_once_is_held_until_the_hold_passes() -> None:
    app = RefusingApp()
    with running(app) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert post(sock, "/refuse", b"same text") == 503
        assert post(sock, "/refuse", b"same text") == 503
        refused_at = app.answered[0]
        resent_started = app.started[1][1]
        # The resend reached the app only once the hold had passed (a lower bound: no timing
        # assumption about how fast the machine is).
        assert resent_started - refused_at >= HOLD * 0.99
        # Refused again, it is held again: the third copy waits as well.
        assert post(sock, "/refuse", b"same text") == 503
        assert app.started[2][1] - app.answered[1] >= HOLD * 0.99


def test_a_held_resend_keeps_the_time_it_arrived_so_its_deadline_counts_from_then() -> None:
    """A request's deadline counts from its arrival (``caller_of`` reads the connection's
    stamp): a resend held past its deadline is refused, never served and answered 200 late."""
    app = RefusingApp()
    with running(app) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert post(sock, "/refuse", b"same text") == 503
        assert post(sock, "/refuse", b"same text") == 503
    (first_arrived, first_started), (arrived, started) = app.arrivals
    assert isinstance(first_arrived, float) and first_arrived <= first_started
    assert isinstance(arrived, float)
    assert started - arrived >= HOLD * 0.99  # held after it arrived; the stamp is the arrival


@pytest.mark.anyio
async def test_the_callers_deadline_counts_from_the_connections_stamp() -> None:
    """``caller_of`` takes the arrival the connection stamped (a held resend's deadline has
    been running while it was held); without a stamp, the arrival is now."""
    from starlette.requests import Request

    from batching.http.requests import caller_of

    loop = asyncio.get_running_loop()
    arrived = loop.time() - 1.0
    caller = caller_of(Request({"type": "http", "headers": [], ARRIVED_KEY: arrived}))
    assert caller.arrived == arrived
    before = loop.time()
    assert caller_of(Request({"type": "http", "headers": []})).arrived >= before


def test_a_different_request_on_the_same_connection_is_not_held() -> None:
    app = RefusingApp()
    with running(app) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert post(sock, "/refuse", b"one text") == 503
        assert post(sock, "/refuse", b"another text") == 503  # another body
        assert post(sock, "/ok", b"another text") == 200  # another path
        # Neither waited for the hold: each reached the app before the hold could pass.
        assert app.started[1][1] - app.answered[0] < HOLD
        assert app.started[2][1] - app.answered[1] < HOLD


def test_the_same_request_on_a_new_connection_from_the_same_address_is_held() -> None:
    app = RefusingApp()
    with running(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
            assert post(first, "/refuse", b"same text") == 503
        # A client that opens a new connection for its retry waits as on the same one.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as second:
            assert post(second, "/refuse", b"same text") == 503
        assert app.started[1][1] - app.answered[0] >= HOLD * 0.99


def test_the_same_request_from_another_address_is_not_held() -> None:
    app = RefusingApp()
    with (
        running(app) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10) as first,
        socket.create_connection(
            ("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)
        ) as second,
    ):
        assert post(first, "/refuse", b"same text") == 503
        assert post(second, "/refuse", b"same text") == 503
        assert app.started[1][1] - app.answered[0] < HOLD


def test_the_refusals_remembered_are_bounded_and_forgotten_when_their_hold_ends() -> None:
    from batching.http.resends import Resends

    resends = Resends(size=3)
    request = ("POST", b"/", b"", 4, 1)
    for index in range(5):
        resends.refused(f"10.0.0.{index}", request, until=10.0 + index, now=0.0)
    assert len(resends) == 3  # the two oldest forgotten
    assert resends.held_until("10.0.0.0", request, now=1.0) is None
    assert resends.held_until("10.0.0.4", request, now=1.0) == 14.0
    assert resends.held_until("10.0.0.4", request, now=1.0) is None  # taken once
    resends.refused("10.0.0.9", request, until=30.0, now=20.0)  # the rest have expired
    assert len(resends) == 1


def test_a_resend_after_the_hold_is_not_held_again() -> None:
    app = RefusingApp()
    with running(app) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert post(sock, "/ok", b"text") == 200
        assert post(sock, "/ok", b"text") == 200  # a 200 asks for no hold
        assert app.started[1][1] - app.answered[0] < HOLD


def test_a_client_that_hangs_up_while_held_costs_nothing() -> None:
    app = RefusingApp()
    with running(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert post(sock, "/refuse", b"same text") == 503
            sock.sendall(b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\nsame text")
        # The held request never reaches the app once its connection is gone.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as other:
            # Wait past the hold on the server's own terms: a request held by another
            # connection of ours takes at least as long.
            assert post(other, "/refuse", b"x") == 503
            assert post(other, "/refuse", b"x") == 503
        assert [body for body, _ in app.started] == [b"same text", b"x", b"x"]


def test_hold_for_waits_for_the_queue_spread_and_never_past_retry_after() -> None:
    rng = random.Random(3)
    holds = [hold_for(0.2, 5.0, rng) for _ in range(200)]
    assert all(0.2 <= hold <= 0.4 for hold in holds)
    assert max(holds) - min(holds) > 0.1  # spread, not synchronised
    assert hold_for(-1.0, 5.0, rng) >= MIN_HOLD  # already drained: one small batch
    assert hold_for(30.0, 2.0, rng) == 2.0


@pytest.mark.anyio
async def test_an_overloaded_answer_asks_its_connection_to_hold_resends() -> None:
    model = GatedModel()
    scopes: list[Any] = []
    app = app_with(model, echo_config(max_queue_size=1))

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        scopes.append(scope)

    async with serving(app) as client:
        holder = asyncio.ensure_future(client.post("/", content=b"holds"))
        await asyncio.to_thread(model.entered.wait, 10)
        queued = asyncio.ensure_future(client.post("/", content=b"queued"))
        for _ in range(1000):
            metrics = (await client.get("/metrics")).text
            if 'batching_queue_depth_items{model="echo"} 1.0' in metrics:
                break
            await asyncio.sleep(0.002)  # polling the queue, as a dashboard does
        else:
            raise AssertionError("the queued item never showed in the queue depth")
        transport = httpx.ASGITransport(app=recording)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as raw:
            refused = await raw.post("/", content=b"one too many")
        assert refused.status_code == 503
        hold = scopes[-1].get(HOLD_KEY)
        assert isinstance(hold, float)
        assert MIN_HOLD <= hold <= float(refused.headers["retry-after"]) * 2
        model.gate.set()
        assert (await holder).status_code == 200
        assert (await queued).status_code == 200


@pytest.mark.anyio
async def test_a_resend_held_past_its_deadline_is_refused_and_never_computed() -> None:
    """Through the whole app: a request whose connection stamped its arrival a second ago (a
    resend held that long) and which asks for 100 ms is answered 504 at once, and the model
    never sees it; the same request stamped now is served."""
    from tests.support.models import EchoModel

    model = EchoModel()
    app = app_with(model, echo_config())
    stamps: list[float] = []

    async def stamped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and stamps:
            scope[ARRIVED_KEY] = stamps.pop()
        await app(scope, receive, send)

    async with serving(app) as client:
        transport = httpx.ASGITransport(app=stamped)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as raw:
            headers = {"X-Request-Timeout-Ms": "100"}
            served_before = len(model.batches)
            stamps.append(asyncio.get_running_loop().time() - 1.0)
            late = await raw.post("/", content=b"held too long", headers=headers)
            assert late.status_code == 504, late.text
            assert "deadline the request asked for (100 ms) passed" in late.json()["error"]
            assert len(model.batches) == served_before  # never computed
            stamps.append(asyncio.get_running_loop().time())
            fresh = await raw.post("/", content=b"held too long", headers=headers)
            assert fresh.status_code == 200, fresh.text
            assert ["held too long"] in model.batches
        assert (await client.get("/v2/health/ready")).status_code == 200
