"""The bounds of an OpenAI completion or chat body, checked before anything is tokenised or
queued: each a 400 naming the field (pure).

They follow the advisories against other servers (an unbounded ``n``, a huge
``prompt_logprobs``, ``chat_template_kwargs`` overriding the template): a request never
makes the server hold more than its model's budget allows, never chooses the template's
code, and never runs the model's output layer over prompt x vocabulary at once.
"""

from __future__ import annotations

import math
import re
from typing import Any

from batching.errors import InvalidRequest
from batching.models.generation.settings import check_stop

__all__ = [
    "MAX_CHAT_CHARS",
    "MAX_COMPLETION_LOGPROBS",
    "MAX_KWARGS",
    "MAX_MESSAGES",
    "MAX_N",
    "MAX_TOKENS",
    "check_chat_bounds",
    "integer",
    "stop_strings",
    "template_kwargs",
]

#: The most choices a request may ask for (``n``): each is a row of the running batch.
MAX_N = 16
#: ``logprobs`` of ``/v1/completions`` (OpenAI's cap); chat's ``top_logprobs`` may reach 20.
MAX_COMPLETION_LOGPROBS = 5
#: The largest ``max_tokens`` or ``truncate_prompt_tokens`` read at all (a model's context
#: bounds them further: the context-length check).
MAX_TOKENS = 1 << 20
#: The most messages a chat may have, and characters of content in all.
MAX_MESSAGES = 512
MAX_CHAT_CHARS = 1 << 19
#: ``chat_template_kwargs``: the most keys, the longest string value.
MAX_KWARGS = 16
MAX_KWARG_CHARS = 1024
#: What ``chat_template_kwargs`` may not set: the template itself and the arguments of
#: ``apply_chat_template`` (a request never chooses the template's code or how it runs).
RESERVED_KWARGS = frozenset(
    {
        "chat_template",
        "conversation",
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "processor_kwargs",
    }
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def integer(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    """``body[key]`` if it is an integer from ``low`` to ``high`` (None: absent or null).

    :raises InvalidRequest: naming ``key`` and the range.
    """
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{key} must be an integer from {low} to {high}")
    return value


def stop_strings(value: Any) -> list[str]:
    """``stop`` as a list: a string or up to :data:`MAX_STOP_STRINGS` non-empty strings of at
    most :data:`MAX_STOP_LENGTH` characters.

    :raises InvalidRequest: naming ``stop``.
    """
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest("stop must be a string or a list of strings")
    try:
        return list(check_stop(value))
    except ValueError as error:
        raise InvalidRequest(str(error)) from None


def check_chat_bounds(body: dict[str, Any]) -> None:
    """The number of messages and their size in all, and no template override.

    :raises InvalidRequest: naming the field.
    """
    if "chat_template" in body:
        raise InvalidRequest(
            "chat_template: a request cannot choose the chat template (the model's own renders "
            "the messages)"
        )
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > MAX_MESSAGES:
            raise InvalidRequest(f"messages: at most {MAX_MESSAGES} messages")
        size = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                size += len(content)
            elif isinstance(content, list):
                size += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
        if size > MAX_CHAT_CHARS:
            raise InvalidRequest(f"messages: at most {MAX_CHAT_CHARS} characters of content in all")


def template_kwargs(value: Any) -> tuple[tuple[str, Any], ...]:
    """``chat_template_kwargs``, checked: at most :data:`MAX_KWARGS` keys named as
    identifiers, none of :data:`RESERVED_KWARGS`, each value a boolean, a number, null or a
    string of at most :data:`MAX_KWARG_CHARS` characters.

    :raises InvalidRequest: naming the key.
    """
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest("chat_template_kwargs must be an object")
    if len(value) > MAX_KWARGS:
        raise InvalidRequest(f"chat_template_kwargs takes at most {MAX_KWARGS} keys")
    checked: list[tuple[str, Any]] = []
    for key, item in value.items():
        where = f"chat_template_kwargs.{key}" if _NAME.match(key) else "chat_template_kwargs"
        if not _NAME.match(key):
            raise InvalidRequest(f"{where}: keys are identifiers of at most 64 characters")
        if key in RESERVED_KWARGS:
            raise InvalidRequest(f"{where}: a request cannot set this (the server does)")
        if isinstance(item, str):
            if len(item) > MAX_KWARG_CHARS:
                raise InvalidRequest(f"{where}: at most {MAX_KWARG_CHARS} characters")
        elif isinstance(item, float) and not math.isfinite(item):
            raise InvalidRequest(f"{where} must be a finite number")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
            raise InvalidRequest(f"{where}: an integer of 64 bits")
        elif item is not None and not isinstance(item, bool | int | float | str):
            raise InvalidRequest(f"{where} must be a boolean, a number, a string or null")
        checked.append((key, item))
    return tuple(checked)
