"""The gRPC door's limits equal HTTP's, and its refusals keep no memory: message size (compressed
or not), the item cap before decoding, connections, handshake, idle and message timeouts, and
keepalive pings; against a real ``server.py`` where memory and file descriptors are measured,
in-process where the door's internals are observed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig
from batching.grpc import GrpcLimits
from batching.grpc import v2 as grpc_v2
from batching.http.limits import ConnectionLimits
from batching.keys import ApiKeys
from tests.support.grpc_door import serving_grpc, stub_for
from tests.support.metrics import sample
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

#: The model server.py serves for ``--model tests.support.models:EchoModel``.
SERVED = "EchoModel"


def echo(**batching: Any) -> ModelConfig:
    return ModelConfig(
        name="echo", source="tests.support.models:EchoModel", batching=BatchingConfig(**batching)
    )


def text_input(texts: list[str], module: Any = triton_grpc_aio, name: str = "text") -> Any:
    tensor = module.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


def code_of(error: InferenceServerException) -> str:
    return str(error.status()).removeprefix("StatusCode.")


# --- a real server.py -------------------------------------------------------------------------


class Server:
    def __init__(self, process: subprocess.Popen[bytes], port: int, grpc_port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        self.grpc_port = grpc_port
        self.ps = psutil.Process(process.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)


@contextlib.contextmanager
def server_py(*flags: str) -> Iterator[Server]:
    """``python server.py`` serving the echo model over HTTP and gRPC, once ready."""
    port, grpc_port = free_port(), free_port()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "server.py", "--model", "tests.support.models:EchoModel"]
            + ["--port", str(port), "--grpc-port", str(grpc_port), *flags],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"server.py never became ready: {log.read()!r}")
                time.sleep(0.05)  # polling a subprocess's readiness: there is no event to await
            yield Server(process, port, grpc_port)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _refused(call: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return code_of(caught.value)


def test_a_hundred_refused_calls_of_any_size_keep_no_memory_on_any_door() -> None:
    # 2 MiB under a 3 MiB limit: parsed whole, then refused (wrong input name); 4 MiB over it:
    # refused by grpc-core; 12 MiB of zeros gzip-compressed to ~12 KiB: refused while inflating.
    with server_py("--max-body-bytes", str(3 * MiB)) as server:
        client = triton_grpc.InferenceServerClient(server.grpc_target)
        http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        parsed = [text_input(["x" * (2 * MiB)], triton_grpc, name="texts")]
        over = [text_input(["x" * (4 * MiB)], triton_grpc)]
        inflated = [text_input(["\0" * (12 * MiB)], triton_grpc)]
        http_parsed = triton_http.InferInput("texts", [1], "BYTES")
        http_parsed.set_data_from_numpy(np.array(["x" * (2 * MiB)], dtype=object))

        def refuse_all(rounds: int) -> None:
            # Every kind, each of the size-bound ones a fifth as often (they cost the client
            # the most: an over-limit message is still sent until grpc-core stops reading it).
            for index in range(rounds):
                assert _refused(lambda: client.infer(SERVED, parsed)) == "INVALID_ARGUMENT"
                if index % 5:
                    continue
                assert _refused(lambda: client.infer(SERVED, over)) == "RESOURCE_EXHAUSTED"
                with pytest.raises(InferenceServerException, match="texts"):
                    http.infer(SERVED, [http_parsed])
                code = _refused(
                    lambda: client.infer(SERVED, inflated, compression_algorithm="gzip")
                )
                assert code == "RESOURCE_EXHAUSTED"

        try:
            refuse_all(5)  # the allocator's and the loop's own first growth
            before = server.rss()
            refuse_all(100)
            after = server.rss()
        finally:
            client.close()
            http.close()
    # Each refused 2 MiB call used to stay in memory (about twice its size) until a full
    # collection: 100 of them, some 400 MB.
    assert after - before < 32 * MiB, (before, after)


def test_idle_grpc_connections_are_capped_and_never_starve_http_liveness() -> None:
    cap = 64
    with server_py("--max-connections", str(cap), "--header-timeout-s", "30") as server:
        fds_before = server.ps.num_fds()
        idle: list[socket.socket] = []
        try:
            for _ in range(600):
                idle.append(socket.create_connection(("127.0.0.1", server.grpc_port)))
            # Liveness and readiness answer while the gRPC port is full.
            with httpx.Client(base_url=server.url, timeout=10) as http:
                assert http.get("/v2/health/live").status_code == 200
                assert http.get("/v2/health/ready").status_code == 200
            # The server holds the cap, not the flood: the rest were closed as they came.
            assert server.ps.num_fds() - fds_before <= cap + 16
            client = triton_grpc.InferenceServerClient(server.grpc_target)
            try:
                # A connection over the cap is closed at once: UNAVAILABLE, never CANCELLED.
                assert _refused(lambda: client.is_server_live()) == "UNAVAILABLE"
            finally:
                client.close()
        finally:
            for held in idle:
                held.close()
        # Once the slots are free again, gRPC serves.
        client = triton_grpc.InferenceServerClient(server.grpc_target)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert client.is_server_live()
                    break
                except InferenceServerException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)  # the server notices the closed sockets on its own time
        finally:
            client.close()


# --- in-process -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_over_max_body_bytes_is_resource_exhausted_compressed_or_not_and_counted() -> None:
    async with serving_grpc(echo(), max_body_bytes=MiB) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            fits = await client.infer("echo", [text_input(["y" * (MiB // 2)])])
            assert fits.as_numpy("echo") is not None
            for compression in (None, "gzip"):
                with pytest.raises(InferenceServerException) as caught:
                    await client.infer(
                        "echo",
                        [text_input(["z" * (4 * MiB)])],
                        compression_algorithm=compression,
                    )
                assert code_of(caught.value) == "RESOURCE_EXHAUSTED"
            # Small on the wire, and within the limit once inflated: served.
            zipped = await client.infer(
                "echo", [text_input(["w" * (MiB // 2)])], compression_algorithm="gzip"
            )
            assert zipped.as_numpy("echo") is not None
        finally:
            await client.close()
        metrics = (await http.get("/metrics")).text
    assert sample(metrics, "batching_requests_total", model="", code="413") == 2
    assert sample(metrics, "batching_rejected_total", model="", reason="too_large") == 2


@pytest.mark.anyio
async def test_over_the_item_cap_is_refused_before_any_item_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[str] = []
    parse = grpc_v2.parse_infer_request

    def spied(request: Any) -> Any:
        decoded.append(threading.current_thread().name)
        return parse(request)

    monkeypatch.setattr(grpc_v2, "parse_infer_request", spied)
    async with serving_grpc(echo(max_items_per_request=8)) as (http, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            # 200,000 empty texts: 800 KB of length prefixes, under the byte limit.
            many = triton_grpc_aio.InferInput("text", [200_000], "BYTES")
            many.set_data_from_numpy(np.array([b""] * 200_000, dtype=object))
            with pytest.raises(InferenceServerException) as caught:
                await client.infer("echo", [many])
            assert code_of(caught.value) == "INVALID_ARGUMENT"
            assert "at most 8 items" in str(caught.value.message())
            # One text of 200,000 elements, declared [1, 200000]: refused the same way.
            wide = triton_grpc_aio.InferInput("text", [1, 200_000], "BYTES")
            wide.set_data_from_numpy(np.array([[b""] * 200_000], dtype=object))
            with pytest.raises(InferenceServerException):
                await client.infer("echo", [wide])
            assert decoded == []
            # A large message within the caps is decoded on a worker thread, not the loop.
            texts = ["t" * 100_000] * 8
            result = await client.infer("echo", [text_input(texts)])
            assert result.as_numpy("echo") is not None
        finally:
            await client.close()
        metrics = (await http.get("/metrics")).text
    assert decoded and decoded[0] != threading.main_thread().name
    assert sample(metrics, "batching_rejected_total", model="echo", reason="too_large") == 2
    assert sample(metrics, "batching_requests_total", model="echo", code="413") == 2


def _door_frames() -> list[types.FrameType]:
    """Frames of the gRPC door's code that only a full collection would free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [
            item
            for item in gc.garbage
            if isinstance(item, types.FrameType)
            and Path(item.f_code.co_filename).parent.name == "grpc"
            and "batching" in item.f_code.co_filename
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


@pytest.mark.anyio
async def test_refused_calls_leave_nothing_for_the_garbage_collector() -> None:
    async with serving_grpc(echo(max_items_per_request=2)) as (_, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            _door_frames()
            for texts, name in ((["a", "b", "c"], "text"), (["a"], "texts"), (["a"], "text")):
                for _ in range(5):
                    with contextlib.suppress(InferenceServerException):
                        await client.infer("echo", [text_input(texts, name=name)], "nope")
                    with contextlib.suppress(InferenceServerException):
                        await client.infer("echo", [text_input(texts, name=name)])
            assert _door_frames() == []
        finally:
            await client.close()


@pytest.mark.anyio
async def test_calls_refused_for_their_key_leave_nothing_for_the_garbage_collector() -> None:
    keys = ApiKeys(["sk-right"])
    async with serving_grpc(echo(), api_keys=keys) as (_, target):
        client = triton_grpc_aio.InferenceServerClient(target)
        try:
            _door_frames()
            for headers in (None, {"authorization": "Bearer sk-wrong"}):
                for _ in range(5):
                    with pytest.raises(InferenceServerException, match="API key"):
                        await client.infer("echo", [text_input(["a"])], headers=headers)
                    with pytest.raises(InferenceServerException, match="API key"):
                        await client.get_model_metadata("echo", headers=headers)
            assert _door_frames() == []
        finally:
            await client.close()


def _timeouts(seconds: float, keep_alive: float) -> ConnectionLimits:
    return ConnectionLimits(
        header_timeout=seconds, body_timeout=seconds, keep_alive_timeout=keep_alive
    )


@pytest.mark.anyio
async def test_silent_connections_idle_connections_and_silent_calls_are_closed() -> None:
    limits = _timeouts(0.3, 0.3)
    async with serving_grpc(echo(), connection_limits=limits) as (http, target):
        host, port = target.split(":")
        # A connection that never says a word (no HTTP/2 preface) is closed: read to its end.
        reader, writer = await asyncio.open_connection(host, int(port))
        await asyncio.wait_for(reader.read(), 10)
        assert reader.at_eof()
        writer.close()

        async with grpc.aio.insecure_channel(target) as channel:
            stub_call = channel.stream_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )
            never = asyncio.Event()

            async def silent() -> Any:
                await never.wait()
                yield service_pb2.ModelInferRequest()

            # A call whose message never comes is answered once HTTP's body timeout passed.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub_call(silent(), timeout=10)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "did not arrive" in str(caught.value.details())
            never.set()

            # A connection left without calls is closed after the keep-alive timeout.
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
                response_deserializer=service_pb2.ServerLiveResponse.FromString,
            )
            assert (await live(service_pb2.ServerLiveRequest(), timeout=10)).live
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            await asyncio.wait_for(
                channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 10
            )
        metrics = (await http.get("/metrics")).text
    assert sample(metrics, "batching_requests_total", model="", code="408") == 1
    assert sample(metrics, "batching_rejected_total", model="", reason="message_timeout") == 1


@pytest.mark.anyio
async def test_keepalive_pings_faster_than_the_minimum_close_the_connection() -> None:
    async with serving_grpc(echo(), connection_limits=_timeouts(10, 60)) as (_, target):
        options = [
            ("grpc.keepalive_time_ms", 50),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            async with stub_for(target) as polite:
                assert (await polite.ServerLive(service_pb2.ServerLiveRequest())).live
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
                response_deserializer=service_pb2.ServerLiveResponse.FromString,
            )
            assert (await live(service_pb2.ServerLiveRequest(), timeout=10)).live
            # Well before the 60 s idle timeout: GOAWAY too_many_pings.
            await asyncio.wait_for(
                channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 10
            )


@pytest.mark.anyio
async def test_a_message_that_is_not_protobuf_is_invalid_argument() -> None:
    async with serving_grpc(echo()) as (_, target):
        async with grpc.aio.insecure_channel(target) as channel:
            raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw(b"\xff\xff\xff\xff", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid" in str(caught.value.details())
    assert "<" not in str(caught.value.details())


@pytest.mark.anyio
async def test_metadata_over_max_header_bytes_is_resource_exhausted() -> None:
    limits = ConnectionLimits(max_header_bytes=4096)
    async with serving_grpc(echo(), connection_limits=limits) as (_, target):
        async with stub_for(target) as stub:
            small = [("x-pad", "a" * 1000)]
            ready = await stub.ServerLive(service_pb2.ServerLiveRequest(), metadata=small)
            assert ready.live
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ServerLive(
                    service_pb2.ServerLiveRequest(), metadata=[("x-pad", "b" * 8192)], timeout=10
                )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_off_means_never_and_the_cap_is_grpc_cores_own() -> None:
    options = dict(
        GrpcLimits(max_message_bytes=123, max_connections=0, idle_timeout=0).server_options()
    )
    assert options["grpc.max_receive_message_length"] == 123
    assert "grpc.max_allowed_incoming_connections" not in options  # 0: no cap, as on HTTP
    assert options["grpc.max_connection_idle_ms"] == 2**31 - 1
