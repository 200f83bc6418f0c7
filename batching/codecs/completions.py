"""OpenAI's text generation bodies: ``POST /v1/completions`` and ``POST /v1/chat/completions``,
their answers and their streamed chunks (pure functions over bytes and dicts).

What a request may set, and how it maps onto the task's parameters
(:mod:`batching.models.tasks.generation`):

- ``max_tokens`` (chat also ``max_completion_tokens``) is ``max_new_tokens``;
- ``temperature`` 0 picks the most likely token, above 0 samples at that temperature; left
  out, the model's generation config decides (most models: the most likely token);
- ``top_p`` and ``seed`` apply when sampling; ``stop`` is a string or a list of strings;
- ``n``, ``best_of``, log-probabilities, ``echo``, ``truncate_prompt_tokens`` and structured
  outputs (:mod:`.completions_options`); chat's ``chat_template_kwargs``; every bound is
  checked first (:mod:`.completions_bounds`);
- ``stream`` and ``stream_options.include_usage``; ``user`` is taken and not used. Every
  other field is a 400 naming it, unless it is sent as OpenAI's default
  (``presence_penalty: 0``, ``logit_bias: {}``, ...), which changes nothing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from batching.documents import JSONObject, parse_object
from batching.errors import InvalidRequest
from batching.models.chat import Chat

from .completions_bounds import (
    MAX_TOKENS,
    check_chat_bounds,
    integer,
    stop_strings,
    template_kwargs,
)
from .completions_options import OPTION_FIELDS, Options, read_options

__all__ = [
    "CompletionRequest",
    "choice",
    "chunk",
    "completion",
    "parse_chat",
    "parse_completion",
    "sse",
    "usage",
    "usage_chunk",
]

#: Fields that change nothing when sent with these values (OpenAI's defaults).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None,),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None,),
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream"}
_COMMON |= {"stream_options", "user"} | OPTION_FIELDS
_ROLES = {"system", "developer", "user", "assistant"}


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A parsed request: the model, what it continues, the task parameters it sets."""

    model: str
    input: str | Chat
    parameters: dict[str, object]
    stream: bool
    include_usage: bool
    chat: bool
    #: ``n``, log-probabilities, ``echo``, ``truncate_prompt_tokens``, the constraint.
    options: Options = Options()


def body_object(body: bytes) -> JSONObject:
    """A generating door's body, a JSON object.

    :raises InvalidRequest: not JSON, or not an object.
    """
    return parse_object(
        body,
        lambda _: InvalidRequest("the body is not valid JSON"),
        lambda _: InvalidRequest("the body must be a JSON object"),
    )


def _number(body: JSONObject, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequest(f"{key} must be a number from {low:g} to {high:g}")
    return float(value)


def _common(body: JSONObject, allowed: set[str], max_key: str) -> tuple[str, dict[str, object]]:
    """The model a body names, and the task parameters its fields set."""
    for key, value in body.items():
        if key in allowed:
            continue
        if key in _NEUTRAL:
            if value not in _NEUTRAL[key]:
                raise InvalidRequest(f"{key} is not supported by this server")
            continue
        raise InvalidRequest(f"unknown field {key!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model must be the name of a served model")
    parameters: dict[str, object] = {}
    key = max_key if body.get(max_key) is not None else "max_tokens"
    maximum = integer(body, key, 1, MAX_TOKENS)
    if maximum is not None:
        parameters["max_new_tokens"] = maximum
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None:
        parameters["do_sample"] = temperature > 0
        if temperature > 0:
            parameters["temperature"] = temperature
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p is not None:
        parameters["top_p"] = top_p
    seed = integer(body, "seed", 0, 2**63 - 1)
    if seed is not None:
        parameters["seed"] = seed
    stop = stop_strings(body.get("stop"))
    if stop:
        parameters["stop"] = stop
    return model, parameters


def _options(body: JSONObject, parameters: dict[str, object], chat: bool) -> Options:
    """The request's :class:`Options`; its log-probabilities and constraint as the task's
    parameters."""
    options = read_options(body, chat)
    if options.logprobs is not None:
        parameters["logprobs"] = options.logprobs
    if options.constraint is not None:
        parameters[options.constraint[0]] = options.constraint[1]
    return options


def _streaming(body: JSONObject) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false")
    options = body.get("stream_options")
    include = False
    if options is not None:
        if not stream:
            raise InvalidRequest("stream_options is only allowed with stream: true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise InvalidRequest("stream_options takes include_usage only")
        value = options.get("include_usage", False)
        if not isinstance(value, bool):
            raise InvalidRequest("stream_options.include_usage must be true or false")
        include = value
    return bool(stream), include


def parse_completion(body: bytes) -> CompletionRequest:
    """A ``/v1/completions`` body.

    :raises InvalidRequest: what the module docstring says is refused.
    """
    parsed = body_object(body)
    model, parameters = _common(parsed, _COMMON | {"prompt"}, "max_tokens")
    options = _options(parsed, parameters, chat=False)
    prompt = parsed.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string (one prompt per request)")
    stream, include = _streaming(parsed)
    return CompletionRequest(model, prompt, parameters, stream, include, False, options)


def _content(index: int, content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest(f"messages[{index}].content: only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"messages[{index}].content: a text part needs a text")
            texts.append(text)
        return "".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string or a list of text parts")


def parse_chat(body: bytes) -> CompletionRequest:
    """A ``/v1/chat/completions`` body.

    :raises InvalidRequest: what the module docstring says is refused, and messages that are
        not a non-empty list of ``{role, content}`` with text content.
    """
    parsed = body_object(body)
    check_chat_bounds(parsed)
    allowed = _COMMON | {"messages", "max_completion_tokens", "chat_template_kwargs"}
    model, parameters = _common(parsed, allowed, "max_completion_tokens")
    options = _options(parsed, parameters, chat=True)
    kwargs = template_kwargs(parsed.get("chat_template_kwargs"))
    messages = parsed.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list")
    pairs: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{index}] must be an object")
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidRequest(f"messages[{index}].role must be one of {sorted(_ROLES)}")
        if set(message) - {"role", "content", "name"}:
            raise InvalidRequest(f"messages[{index}]: only role, content and name are supported")
        pairs.append((str(role), _content(index, message.get("content"))))
    stream, include = _streaming(parsed)
    chat = Chat(tuple(pairs), kwargs)
    return CompletionRequest(model, chat, parameters, stream, include, True, options)


def new_id(chat: bool) -> str:
    """An answer's id (``chatcmpl-...`` or ``cmpl-...``)."""
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def usage(prompt: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def choice(
    request: CompletionRequest,
    index: int,
    text: str,
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice of a whole answer (``logprobs``: from :mod:`.completions_logprobs`)."""
    made: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
    if request.chat:
        made["message"] = {"role": "assistant", "content": text}
    else:
        made["text"] = text
    return made


def completion(
    request: CompletionRequest,
    answer_id: str,
    created: int,
    choices: list[dict[str, Any]],
    counts: dict[str, int],
) -> bytes:
    """The answer of a request without ``stream``: its :func:`choice` values."""
    return orjson.dumps(
        {
            "id": answer_id,
            "object": "chat.completion" if request.chat else "text_completion",
            "created": created,
            "model": request.model,
            "choices": choices,
            "usage": counts,
        }
    )


def chunk(
    request: CompletionRequest,
    answer_id: str,
    created: int,
    text: str | None,
    finish: str | None = None,
    *,
    first: bool = False,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk of choice ``index``: a piece of text (with its tokens'
    ``logprobs``), or the end (``finish``)."""
    choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
    if request.chat:
        delta: dict[str, object] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {
        "id": answer_id,
        "object": "chat.completion.chunk" if request.chat else "text_completion",
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": None,
    }


def usage_chunk(
    request: CompletionRequest, answer_id: str, created: int, counts: dict[str, int]
) -> dict[str, object]:
    """The chunk before ``[DONE]`` when ``stream_options.include_usage`` is set."""
    return {
        "id": answer_id,
        "object": "chat.completion.chunk" if request.chat else "text_completion",
        "created": created,
        "model": request.model,
        "choices": [],
        "usage": counts,
    }


def sse(data: dict[str, object] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"
