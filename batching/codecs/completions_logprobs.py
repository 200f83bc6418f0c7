"""Log-probabilities as OpenAI's answers carry them (pure): the two shapes differ.

- ``/v1/completions`` (``logprobs: k``): ``{"tokens": [...], "token_logprobs": [...],
  "top_logprobs": [{token: logprob, ...}, ...], "text_offset": [...]}``; with ``echo`` the
  prompt's tokens come first (the first of them has ``null`` for its log-probability and
  alternatives), and ``text_offset`` counts characters from the start of the answer's text;
- ``/v1/chat/completions`` (``logprobs: true``, ``top_logprobs: k``): ``{"content":
  [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
  "refusal": null}``; ``bytes`` is the token's text in UTF-8 (a token that is part of a
  character decodes to U+FFFD alone, as in vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batching.models.generation.token_logprobs import Echo, TokenLogprob

__all__ = ["chat_logprobs", "completion_logprobs"]


def completion_logprobs(
    entries: Sequence[TokenLogprob], echo: Echo | None = None, offset: int = 0
) -> dict[str, Any]:
    """The completions shape of ``entries`` (after ``echo``'s prompt tokens, when it has
    log-probabilities); ``offset``: the characters of the answer's text before them."""
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    if echo is not None and echo.logprobs is not None:
        for token, entry in zip(echo.tokens, echo.logprobs, strict=True):
            tokens.append(token)
            logprobs.append(None if entry is None else entry.logprob)
            tops.append(None if entry is None else dict(entry.top))
            offsets.append(offset)
            offset += len(token)
    for entry in entries:
        tokens.append(entry.token)
        logprobs.append(entry.logprob)
        tops.append(dict(entry.top))
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """The chat shape of ``entries``."""
    content = []
    for entry in entries:
        item = _token(entry.token, entry.logprob)
        item["top_logprobs"] = [_token(text, logprob) for text, logprob in entry.top]
        content.append(item)
    return {"content": content, "refusal": None}
