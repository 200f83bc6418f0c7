"""``ModelStreamInfer`` for a generating model (text-generation, or an encoder-decoder's
task): decoupled responses, as Triton's LLM backends send them and tritonclient's
``start_stream``/``async_stream_infer`` read them.

Each request on the stream carries one text (a BYTES input of one element) and the task's
parameters; its answer is a series of responses, each with the next piece of text in the
``text_output`` output (BYTES, shape [1]) and the parameter ``triton_final_response``, true on
the last; with the ``logprobs`` parameter, a ``logprobs`` output (BYTES, shape [1]) holds the
JSON list of the log-probabilities of the tokens since the last response
(:func:`~batching.kserve.generate.logprob_entries`). With
``triton_enable_empty_final_response`` set (tritonclient's
``enable_empty_final_response=True``) the last piece goes out as usual and an empty response
with the flag follows. Requests on one stream are served concurrently; each response names its
request's ``id``. An error (before or after the first piece) is a response with
``error_message``: it ends that request only, and the stream serves the others. A cancelled
call stops its sequences at the next decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

import orjson
from tritonclient.grpc import service_pb2

from batching.answers import internal_message
from batching.errors import BatchingError, InvalidRequest
from batching.kserve.generate import LOGPROBS_OUTPUT, logprob_entries
from batching.kserve.infer import items_of, task_items_of, timeout_parameter
from batching.models.parameters import TaskItem
from batching.plane import Caller, DataPlane, Generation
from batching.runtime.deployment import Deployment

from .errors import INTERNAL, status_of
from .tensors import parse_infer_request

__all__ = ["TEXT_OUTPUT", "model_stream_infer"]

logger = logging.getLogger("batching")

#: The output that carries each piece of text.
TEXT_OUTPUT = "text_output"
_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"


def _response(request: Any, text: str | None, final: bool, logprobs: bytes | None = None) -> Any:
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    outputs = [] if text is None else [(TEXT_OUTPUT, text.encode())]
    if logprobs is not None:
        outputs.append((LOGPROBS_OUTPUT, logprobs))
    for name, data in outputs:
        output = response.outputs.add()
        output.name, output.datatype = name, "BYTES"
        output.shape.append(1)
        # As Triton sends it: the element in raw_output_contents, its length first (4 bytes,
        # little-endian), which tritonclient's as_numpy reads.
        response.raw_output_contents.append(struct.pack("<I", len(data)) + data)
    response.parameters[_FINAL].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=response)


def _error(request: Any, message: str) -> Any:
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    return service_pb2.ModelStreamInferResponse(error_message=message, infer_response=response)


async def _open(
    plane: DataPlane, deployment: Deployment, request: Any, caller: Caller
) -> Generation:
    parsed = parse_infer_request(request)
    for wanted in parsed.outputs:
        if wanted.name not in (TEXT_OUTPUT, LOGPROBS_OUTPUT):
            raise InvalidRequest(
                f"unexpected output {wanted.name!r}: a stream answers {TEXT_OUTPUT!r} (and "
                f"{LOGPROBS_OUTPUT!r} with the logprobs parameter)"
            )
    items = items_of(deployment, dataclasses.replace(parsed, outputs=[]))
    if len(items) != 1:
        raise InvalidRequest("a streamed request carries one text (an input of one element)")
    items = task_items_of(deployment, parsed, items) or items
    caller = caller.within(timeout_parameter(parsed.parameters))
    return await plane.generate(deployment, items[0], caller)


async def _serve_one(
    plane: DataPlane, request: Any, context: Any, rid: str, out: asyncio.Queue[Any]
) -> None:
    empty_final = False
    parameter = request.parameters.get(_EMPTY_FINAL)
    if parameter is not None:
        empty_final = parameter.bool_param
    generation: Generation | None = None
    deployment = None
    # The call's gRPC deadline; each request's `timeout` parameter may lower it.
    caller = Caller(rid, context.time_remaining())
    started = plane.now()
    status = INTERNAL[1]
    try:
        deployment = plane.deployment(request.model_name, request.model_version or None)
        generation = await _open(plane, deployment, request, caller)
        status = 200
        item = generation.stream.item
        asked = isinstance(item, TaskItem) and item.get("logprobs") is not None
        sent = 0
        async for text, last in generation.parts():
            if not (text or (last and not empty_final)):
                continue
            logprobs = None
            if asked:
                logprobs = orjson.dumps(logprob_entries(generation.logprobs[sent:]))
                sent = len(generation.logprobs)
            await out.put(_response(request, text, last and not empty_final, logprobs))
        if empty_final:
            await out.put(_response(request, None, True))
    except BatchingError as exc:
        if generation is None:
            status = status_of(exc)[1]
        await out.put(_error(request, str(exc)))
    except Exception:
        logger.exception("gRPC stream request %s failed with an internal error", rid)
        await out.put(_error(request, internal_message(rid)))
    finally:
        if generation is not None:
            generation.close()
        plane.record(deployment, status, started)


async def model_stream_infer(
    plane: DataPlane, requests: AsyncIterator[Any], context: Any, new_id: Any
) -> AsyncIterator[Any]:
    """The responses to the stream's ``requests``, as they come."""
    out: asyncio.Queue[Any] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()
    done = object()

    async def read() -> None:
        try:
            async for request in requests:
                rid = request.id or new_id()
                task = asyncio.create_task(_serve_one(plane, request, context, rid, out))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            out.put_nowait(done)

    reader = asyncio.create_task(read())
    try:
        while (response := await out.get()) is not done:
            yield response
    finally:
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
