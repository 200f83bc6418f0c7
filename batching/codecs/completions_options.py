"""The OpenAI generation fields beyond the sampling ones (pure): ``n`` choices (``best_of``),
log-probabilities (completions: ``logprobs: k``; chat: ``logprobs: true`` and
``top_logprobs: k``), ``echo``, vLLM's ``truncate_prompt_tokens``, and structured outputs:
``response_format`` (``json_object``, ``json_schema``) or vLLM's ``structured_outputs``
(``{"json": schema}``, ``{"regex": ...}``, ``{"grammar": ...}``, one of them). A constraint
that does not compile is a 400 naming the field, before anything is tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from batching.errors import InvalidRequest
from batching.models.generation.grammars import grammar_of
from batching.models.generation.token_logprobs import MAX_TOP_LOGPROBS

from .completions_bounds import MAX_COMPLETION_LOGPROBS, MAX_N, MAX_TOKENS, integer

__all__ = ["OPTION_FIELDS", "Options", "read_options"]

#: The fields :func:`read_options` reads.
OPTION_FIELDS = frozenset(
    {
        "n",
        "best_of",
        "logprobs",
        "top_logprobs",
        "echo",
        "truncate_prompt_tokens",
        "response_format",
        "structured_outputs",
    }
)
_STRUCTURED = {"json": "json_schema", "regex": "regex", "grammar": "grammar"}


@dataclass(frozen=True, slots=True)
class Options:
    """What a request asks beyond the sampling fields."""

    n: int = 1
    #: Alternatives per token (None: no log-probabilities).
    logprobs: int | None = None
    echo: bool = False
    truncate_prompt_tokens: int | None = None
    #: The task parameter of its constraint and its text (``("json_schema", "{...}")``).
    constraint: tuple[str, str] | None = None
    #: ``response_format`` asked for JSON (the SDK's ``parse`` reads the answer as JSON).
    json: bool = False


def read_options(body: dict[str, Any], chat: bool) -> Options:
    """The fields of :data:`OPTION_FIELDS` in ``body``, checked.

    :raises InvalidRequest: naming the field.
    """
    n = integer(body, "n", 1, MAX_N) or 1
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise InvalidRequest(
            "best_of is not supported (ranking several answers; vLLM removed it too): "
            "ask for n choices"
        )
    logprobs = _logprobs(body, chat)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise InvalidRequest("echo must be true or false")
    if echo and chat:
        raise InvalidRequest("echo is a field of /v1/completions, not of chat")
    truncate = integer(body, "truncate_prompt_tokens", 1, MAX_TOKENS)
    constraint, json = _constraint(body)
    return Options(n, logprobs, bool(echo), truncate, constraint, json)


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if not chat:
        if body.get("top_logprobs") is not None:
            raise InvalidRequest("top_logprobs is a chat field: completions take logprobs: k")
        return integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise InvalidRequest("logprobs must be true or false (chat; top_logprobs: how many)")
    top = integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and top > 0 and not wanted:
        raise InvalidRequest("top_logprobs needs logprobs: true")
    return (top or 0) if wanted else None


def _constraint(body: dict[str, Any]) -> tuple[tuple[str, str] | None, bool]:
    found: list[tuple[str, str, str]] = []
    response = body.get("response_format")
    json = False
    if response is not None:
        read = _response_format(response)
        if read is not None:
            found.append(("response_format", *read))
            json = True
    structured = body.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, dict) or len(structured) != 1:
            raise InvalidRequest(
                "structured_outputs must be an object with one of: " + ", ".join(_STRUCTURED)
            )
        ((kind, value),) = structured.items()
        if kind not in _STRUCTURED:
            raise InvalidRequest(
                f"structured_outputs.{kind} is not supported (one of: {', '.join(_STRUCTURED)})"
            )
        if kind == "json" and isinstance(value, dict):
            value = orjson.dumps(value).decode()
        if not isinstance(value, str):
            raise InvalidRequest(f"structured_outputs.{kind} must be a string")
        found.append((f"structured_outputs.{kind}", _STRUCTURED[kind], value))
    if len(found) > 1:
        raise InvalidRequest("response_format and structured_outputs: send one of them")
    if not found:
        return None, False
    field, key, text = found[0]
    try:
        grammar_of(key, text)
    except ValueError as exc:
        reason = str(exc).split(": ", 1)[-1] if "is not valid" in str(exc) else str(exc)
        raise InvalidRequest(f"{field}: {reason}") from None
    return (key, text), json


def _response_format(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequest("response_format must be an object with a type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", '{"type": "object"}'
    if kind != "json_schema":
        raise InvalidRequest(
            f"response_format.type {kind!r} is not supported (text, json_object, json_schema)"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequest("response_format.json_schema must be an object with a name")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON schema object")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("response_format.json_schema.strict must be true or false")
    return "json_schema", orjson.dumps(schema).decode()
