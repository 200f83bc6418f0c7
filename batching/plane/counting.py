"""Token counting with a model's own tokenizer, on the event loop or a worker thread: for
token-aware batching, the generation budget, usage reports and request limits.

A request the model would refuse whatever its tokens (overloaded, not ready, too many items)
is refused before its tokens are counted, so that a storm of refused requests costs the loop
little: the caller passes that check as ``admit``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batching.errors import UnprocessableInput
from batching.models.items import Item, item_text
from batching.models.parameters import TaskItem
from batching.runtime.deployment import Deployment

__all__ = [
    "TOKENIZE_ON_LOOP_CHARS",
    "TokenCounts",
    "cheap_to_tokenize",
    "count_tokens",
    "tokens_for_batching",
    "untokenizable",
]

logger = logging.getLogger("batching")

#: Inputs with more characters than this in all are tokenized on a worker thread: one long
#: text takes the tokenizer as long as many short ones.
TOKENIZE_ON_LOOP_CHARS = 16384


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """What a model's tokenizer says about a request's inputs, one entry per input.

    Each list is None when the model cannot count (it has no ``count_tokens``).
    """

    #: Tokens the model runs: special tokens included, after truncation at its max length
    #: (its ``count_tokens``, as token-aware batching counts them).
    used: list[int] | None
    #: Tokens before truncation, counted no further than the limit asked for (its
    #: ``token_length``; its ``count_tokens`` when it has none); None when no limit was asked.
    lengths: list[int] | None


def cheap_to_tokenize(inputs: Sequence[Item]) -> bool:
    """Whether ``inputs`` are few and short enough to tokenize on the event loop."""
    if len(inputs) > 16:
        return False
    size = 0
    for item in inputs:
        if isinstance(item, TaskItem):
            item = item.input
        if isinstance(item, dict):
            size += sum(len(value) for value in item.values() if isinstance(value, str))
            continue
        text = item_text(item)  # a text, or an embed or tokenize item's prompt and text
        if text is None:
            return False
        size += len(text)
    return size <= TOKENIZE_ON_LOOP_CHARS


def untokenizable(exc: Exception, request_id: str) -> UnprocessableInput:
    """The 422 of inputs the model's tokenizer raised ``exc`` on. The tokenizer's own text may
    hold paths, addresses or reprs of library objects: it goes to the log under the request
    id, and the answer names only the exception's class."""
    logger.warning(
        "request %s: the model cannot tokenize its input: %s: %s",
        request_id or "-",
        type(exc).__name__,
        exc,
    )
    return UnprocessableInput(
        f"the model cannot tokenize this input ({type(exc).__name__}; request id "
        f"{request_id or '-'})"
    )


async def count_tokens(
    deployment: Deployment,
    inputs: Sequence[Item],
    *,
    limit: int | None = None,
    request_id: str = "",
    admit: Callable[[], object] | None = None,
) -> TokenCounts:
    """Count the tokens of ``inputs`` with the model's own tokenizer, whether or not it is
    batched by tokens; with ``limit``, each input's length before truncation too, counted no
    further than ``limit``.

    :param admit: raises if the request would be refused whatever its tokens; called before
        they are counted (one that passes is checked again when it is queued).
    :raises UnprocessableInput: the model cannot tokenise an input.
    """
    hooks = await deployment.counting_hooks()
    count, length = hooks.count_tokens, hooks.token_length
    if count is None:
        return TokenCounts(None, None)
    if admit is not None:
        admit()

    def counted() -> TokenCounts:
        assert count is not None
        used = [count(item) for item in inputs]
        if limit is None:
            return TokenCounts(used, None)
        if length is None:
            return TokenCounts(used, used)
        return TokenCounts(used, [length(item, limit) for item in inputs])

    try:
        if cheap_to_tokenize(inputs):
            return counted()
        # Tokenizing a large request would hold up every other request on the loop.
        return await asyncio.to_thread(counted)
    except Exception as exc:
        failure = untokenizable(exc, request_id)
    raise failure


async def tokens_for_batching(
    deployment: Deployment, inputs: Sequence[Item], request_id: str
) -> list[int] | None:
    """Each input's tokens when the model is batched by tokens (None otherwise).

    :raises UnprocessableInput: the model cannot tokenise an input.
    """
    if deployment.count_tokens is None:
        return None
    failure: UnprocessableInput | None = None
    try:
        return await deployment.tokens_of(inputs, offload=not cheap_to_tokenize(inputs))
    except Exception as exc:
        failure = untokenizable(exc, request_id)
    raise failure
