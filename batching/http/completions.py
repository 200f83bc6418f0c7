"""OpenAI-compatible text generation: ``POST /v1/completions`` and ``POST /v1/chat/completions``
for a generating model (text-generation; summarization, translation and text2text-generation,
whose ``prompt`` is the input text), with and without ``stream: true``.

A streamed answer is server-sent events: ``data: {chunk}`` per piece of text (chat: the first
delta carries ``role: assistant``), a last chunk with its ``finish_reason``, the usage chunk
when ``stream_options.include_usage`` is set, then ``data: [DONE]``. Everything that can go
wrong before the first token (a bad body, an unknown model, a full token budget, the deadline)
is an ordinary OpenAI error answer with its status; an error after it is one
``data: {"error": {...}}`` event, and the stream ends. A client that goes away stops its
sequence at the next decode step. The body format is :mod:`batching.codecs.completions`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from batching.answers import internal_message
from batching.codecs.completions import (
    CompletionRequest,
    choice,
    completion,
    new_id,
    parse_chat,
    parse_completion,
    sse,
    usage,
    usage_chunk,
)
from batching.codecs.completions_items import choice_items
from batching.errors import BatchingError
from batching.models.tasks.generation import streams
from batching.plane import DataPlane, Generation

from .choices import answer_logprobs, choice_chunks, merged
from .errors import recorded, status_of, with_request_id
from .openai import ANY_METHOD, openai_endpoint, served_model
from .requests import read_unattributed_body

__all__ = ["completion_routes", "is_generation_model"]

logger = logging.getLogger("batching")

#: Headers of a stream: no caching, and no buffering in a proxy in front.
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def is_generation_model(metadata: Mapping[str, object]) -> bool:
    """Whether a model's metadata says it generates text from a prompt (text-generation, or
    an encoder-decoder's summarization, translation, text2text-generation)."""
    task = metadata.get("task")
    return isinstance(task, str) and streams(task)


def _error_event(exc: BaseException, request_id: str) -> bytes:
    if isinstance(exc, BatchingError):
        status = status_of(exc)
        message = with_request_id(str(exc), status, request_id)
        kind = "invalid_request_error" if status < 500 else "server_error"
    else:
        logger.error("request %s failed while streaming", request_id, exc_info=exc)
        message, kind = internal_message(request_id), "server_error"
    return sse({"error": {"message": message, "type": kind, "param": None, "code": None}})


async def _events(
    parsed: CompletionRequest, generations: list[Generation], request_id: str
) -> AsyncIterator[bytes]:
    answer_id, created = new_id(parsed.chat), int(time.time())
    try:
        streams = [
            choice_chunks(parsed, index, generation, answer_id, created)
            for index, generation in enumerate(generations)
        ]
        async for event in merged(streams):
            yield sse(event)
        if parsed.include_usage:
            yield sse(usage_chunk(parsed, answer_id, created, _usage(generations)))
        yield sse("[DONE]")
    except Exception as exc:
        yield _error_event(exc, request_id)
    finally:
        # Also when the client went away and the response was cancelled.
        for generation in generations:
            generation.close()


def _usage(generations: list[Generation]) -> dict[str, int]:
    """The prompt once, the tokens of every choice."""
    completion_tokens = sum(generation.completion_tokens for generation in generations)
    return usage(generations[0].prompt_tokens, completion_tokens)


def _answer(parsed: CompletionRequest, generations: list[Generation]) -> bytes:
    choices = []
    for index, generation in enumerate(generations):
        text = generation.text
        if generation.echo is not None:
            text = generation.echo.text + text
        logprobs = answer_logprobs(parsed, generation)
        choices.append(choice(parsed, index, text, generation.finish_reason, logprobs))
    return completion(parsed, new_id(parsed.chat), int(time.time()), choices, _usage(generations))


def completion_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The OpenAI text generation routes over ``plane``."""

    async def generate(request: Request, chat: bool) -> Response:
        body = await read_unattributed_body(plane, request, max_body_bytes)
        parsed = parse_chat(body) if chat else parse_completion(body)
        deployment = served_model(plane, parsed.model, is_generation_model, "a generating")
        with recorded(plane, deployment, request) as caller:
            items = choice_items(deployment, parsed)
            if parsed.stream:
                generations = await plane.generate_all(deployment, items, caller)
                return StreamingResponse(
                    _events(parsed, generations, caller.request_id),
                    media_type="text/event-stream",
                    headers=SSE_HEADERS,
                )
            done = await plane.complete(deployment, items, caller)
            return Response(_answer(parsed, done), media_type="application/json")

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    return [
        Route("/v1/completions", openai_endpoint(completions, "POST"), methods=ANY_METHOD),
        Route(
            "/v1/chat/completions", openai_endpoint(chat_completions, "POST"), methods=ANY_METHOD
        ),
    ]
