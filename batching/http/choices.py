"""The streamed chunks of an OpenAI request's choices (``n``), merged as they come: each
choice's pieces of text with its tokens' log-probabilities (the ones generated since its
last chunk), the prompt first when ``echo`` asks, then its chunk with ``finish_reason``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from batching.codecs.completions import CompletionRequest, chunk
from batching.codecs.completions_logprobs import chat_logprobs, completion_logprobs
from batching.plane import Generation

__all__ = ["answer_logprobs", "choice_chunks", "merged"]


def answer_logprobs(
    request: CompletionRequest, generation: Generation, start: int = 0, offset: int = 0
) -> dict[str, Any] | None:
    """``generation``'s log-probabilities from its ``start``-th token, in the door's shape
    (None: not asked). ``offset``: characters of the answer's text before them; the echoed
    prompt's come first when ``start`` is 0 (completions)."""
    if request.options.logprobs is None:
        return None
    entries = generation.logprobs[start:]
    if request.chat:
        return chat_logprobs(entries)
    return completion_logprobs(entries, generation.echo if start == 0 else None, offset)


async def choice_chunks(
    request: CompletionRequest, index: int, generation: Generation, answer_id: str, created: int
) -> AsyncIterator[dict[str, Any]]:
    """One choice's chunks: its pieces, then its end."""
    sent_tokens = 0
    sent_chars = 0
    echoed = False
    if request.chat:
        yield chunk(request, answer_id, created, "", first=True, index=index)

    def piece(text: str | None, finish: str | None = None) -> dict[str, Any]:
        nonlocal sent_tokens, sent_chars, echoed
        if not echoed and generation.echo is not None:
            text = generation.echo.text + (text or "")
        logprobs = answer_logprobs(request, generation, sent_tokens, sent_chars)
        echoed = True
        sent_tokens = len(generation.logprobs)
        sent_chars += len(text or "")
        return chunk(request, answer_id, created, text, finish, index=index, logprobs=logprobs)

    async for text in generation.pieces():
        yield piece(text)
    yield piece(None, generation.finish_reason)


async def merged(streams: list[AsyncIterator[dict[str, Any]]]) -> AsyncIterator[dict[str, Any]]:
    """The items of ``streams`` as they come (one stream: in order, without tasks); an error
    in any ends the merge with it."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue[tuple[dict[str, Any] | None, BaseException | None]] = asyncio.Queue()

    async def pump(stream: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async for item in stream:
                await queue.put((item, None))
        except Exception as exc:
            await queue.put((None, exc))
            return
        await queue.put((None, None))

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            got, error = await queue.get()
            if error is not None:
                raise error
            if got is None:
                running -= 1
            else:
                yield got
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
