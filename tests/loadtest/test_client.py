"""``load_test.client``: sending the load, on schedule, through any connection handling."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
from collections.abc import Iterator

from load_test.client import LoadSpec, Target, count_outputs
from load_test.measure import measure
from load_test.payloads import build_payloads
from load_test.schedule import Segment
from tests.support.fake_server import FakeSettings, serve


def test_count_outputs_reads_both_answer_shapes() -> None:
    assert count_outputs("json", b'{"model": "m", "outputs": [1, 2, 3]}') == 3
    assert count_outputs("v2", b'{"outputs": [{"name": "e", "shape": [4, 384], "data": []}]}') == 4
    assert count_outputs("json", b"not json") is None
    assert count_outputs("json", b'{"error": "x"}') is None


@contextlib.contextmanager
def raw_http_server() -> Iterator[str]:
    """A hand-written HTTP/1.1 server whose answers vary in framing and connection handling:
    chunked; ``Connection: close``; and keep-alive that it then closes anyway (the race a
    client must retry through)."""
    loop = asyncio.new_event_loop()
    answered = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                kind = next(answered) % 3
                if kind == 0:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b'5\r\n{"out\r\n9\r\nputs": [1\r\n2\r\n]}\r\n0\r\n\r\n'
                    )
                    await writer.drain()
                    continue
                body = b'{"outputs": [1]}'
                close = b"Connection: close\r\n" if kind == 1 else b""
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), close, body)
                )
                await writer.drain()
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


def test_client_handles_chunked_close_and_closed_keep_alive_connections() -> None:
    with raw_http_server() as url:
        payloads = build_payloads(api="json", items=(1, 1), count=4)
        spec = LoadSpec(payloads=payloads, concurrency=1, requests=30)
        measured = measure(Target.parse(url), spec, scrape=False)
    summary = measured.doc["summary"]
    assert summary["outcomes"]["200"] == 30, summary["outcomes"]
    assert measured.doc["client"]["connections_opened"] >= 20


def test_open_loop_latency_includes_a_stall_that_held_back_sends() -> None:
    """No coordinated omission: requests the tool could not send while the server stalled
    (its only connection was stuck) are timed from when they were due, not from when they
    finally went out."""
    stall = 0.3
    with serve(FakeSettings(stall_at=5, stall_s=stall)) as (url, _):
        payloads = build_payloads(api="json", items=(1, 1), count=8)
        spec = LoadSpec(
            payloads=payloads,
            segments=(Segment(100, 100, math.inf),),
            process="fixed",
            requests=40,
            max_connections=1,
        )
        measured = measure(Target.parse(url), spec, scrape=False)
    rec = measured.result.records
    assert rec.status == [200] * 40
    order = sorted(range(40), key=lambda i: rec.intended[i])
    latency = [rec.done[i] - rec.intended[i] for i in order]
    service = [rec.done[i] - rec.sent[i] for i in order]
    stalled = order[5]
    stall_end = rec.done[stalled]
    assert stall_end - rec.sent[stalled] >= stall * 0.9
    # Every request due during the stall finished after it, and its latency says so.
    during = [k for k in range(6, 40) if rec.intended[order[k]] < stall_end]
    assert len(during) >= 20
    for k in during:
        assert latency[k] >= stall_end - rec.intended[order[k]]
        assert latency[k] > service[k]
    # Timed from the actual send, the stall would have shown in one request only.
    slow_by_send = sum(1 for s in service if s > 0.1)
    slow_by_schedule = sum(1 for v in latency if v > 0.1)
    assert slow_by_send == 1
    assert slow_by_schedule >= 15
    doc = measured.doc
    assert doc["summary"]["latency"]["p90_ms"] > 100
    assert doc["summary"]["service_time"]["p90_ms"] < 100
    assert any("--max-connections" in w for w in doc["client"]["warnings"])


def test_open_loop_sends_on_schedule_while_the_server_is_slow() -> None:
    # With connections to spare, requests go out on time even while earlier ones hang.
    with serve(FakeSettings(stall_at=0, stall_s=0.2)) as (url, _):
        payloads = build_payloads(api="json", items=(1, 1), count=4)
        spec = LoadSpec(
            payloads=payloads,
            segments=(Segment(100, 100, math.inf),),
            process="fixed",
            requests=15,
            max_connections=64,
        )
        measured = measure(Target.parse(url), spec, scrape=False)
    rec = measured.result.records
    lags = [rec.sent[i] - rec.intended[i] for i in range(len(rec))]
    assert max(lags) < 0.1  # none waited for the stall to end before being sent
    assert measured.doc["client"]["max_in_flight"] > 5
