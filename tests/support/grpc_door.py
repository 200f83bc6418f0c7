"""Serve an app with its gRPC door on 127.0.0.1, and build requests tritonclient cannot send
(typed ``contents``, reserved parameters) with the stubs generated in ``tritonclient.grpc``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor

from batching import ModelConfig, create_app
from tests.support.servers import free_port, running


@contextlib.asynccontextmanager
async def serving_grpc(
    models: ModelConfig | list[ModelConfig], model: Any = None, **kwargs: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """Serve ``models`` (each built from its source, or all as ``model`` when given) over HTTP
    and gRPC; yields an HTTP client on the server and the gRPC target ``127.0.0.1:port``."""
    if model is not None:
        builder: Callable[[ModelConfig], Any] = lambda _: model  # noqa: E731
        kwargs["builder"] = builder
    port = free_port()
    app = create_app(models, grpc_port=port, **kwargs)
    async with running(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def stub_for(target: str) -> AsyncIterator[Any]:
    """tritonclient's generated ``GRPCInferenceServiceStub`` on an asyncio channel."""
    async with grpc.aio.insecure_channel(target) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def typed_request(
    model: str, name: str, datatype: str, shape: list[int], field: str, values: Any
) -> Any:
    """A ``ModelInferRequest`` whose one input carries ``values`` in ``contents.<field>``."""
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return request


def raw_output(response: Any, index: int = 0) -> np.ndarray:
    """Output ``index`` of a ``ModelInferResponse``, decoded from ``raw_output_contents``."""
    output = response.outputs[index]
    raw = response.raw_output_contents[index]
    if output.datatype == "BYTES":
        data = deserialize_bytes_tensor(raw)
    else:
        dtypes = {"FP32": "<f4", "FP64": "<f8", "INT64": "<i8", "INT32": "<i4", "BOOL": "?"}
        data = np.frombuffer(raw, dtype=dtypes[output.datatype])
    return data.reshape(list(output.shape))
