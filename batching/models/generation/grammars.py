"""Structured outputs: a request's constraint (a JSON schema, a regular expression or a Lark
grammar) as the grammar `llguidance <https://github.com/guidance-ai/llguidance>`_ runs, checked
before the request is queued (no tokenizer, no torch).

The task parameters that carry one (at most one per request, every door):

- ``json_schema``: a JSON schema, as a JSON text (OpenAI's ``response_format`` ``json_schema``
  and ``json_object``, ``{"type": "object"}``, arrive here);
- ``regex``: a regular expression the whole answer matches;
- ``grammar``: a grammar in llguidance's Lark syntax (``start: ...``), which also takes
  ``%json {...}`` and ``/regex/`` terminals.

A constraint that does not compile (an invalid schema, regex or grammar) is a
:class:`ValueError` naming the parameter and llguidance's reason; so is one over
:data:`MAX_CONSTRAINT_CHARS`. Compiling runs under llguidance's own resource limits.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = [
    "CONSTRAINT_KEYS",
    "MAX_CONSTRAINT_CHARS",
    "check_constraint",
    "constraint_of",
    "grammar_of",
]

#: The task parameters that constrain the answer, one at most per request.
CONSTRAINT_KEYS = ("json_schema", "regex", "grammar")
#: The longest schema, regular expression or grammar a request may send.
MAX_CONSTRAINT_CHARS = 65536
#: How llguidance reads JSON schemas: compact output (no free whitespace between tokens,
#: which a small model would fill until its length runs out).
_JSON_OPTIONS: Any = {"whitespace_flexible": False}


def constraint_of(parameters: dict[str, Any]) -> tuple[str, str] | None:
    """The ``(key, text)`` of the constraint in ``parameters`` (None: there is none).

    :raises ValueError: more than one.
    """
    found = [(key, parameters[key]) for key in CONSTRAINT_KEYS if parameters.get(key) is not None]
    if len(found) > 1:
        raise ValueError(
            f"parameters {found[0][0]!r} and {found[1][0]!r}: a request takes one constraint"
        )
    return found[0] if found else None


def check_constraint(parameters: dict[str, Any]) -> None:
    """Refuse a request's constraint that does not compile, before it is queued.

    :raises ValueError: naming the parameter and why.
    """
    found = constraint_of(parameters)
    if found is not None:
        grammar_of(*found)


def grammar_of(key: str, text: str) -> str:
    """The llguidance grammar of constraint ``key`` (:data:`CONSTRAINT_KEYS`), checked.

    :raises ValueError: it is too long, or it does not compile (the message names ``key``).
    """
    import llguidance

    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ValueError(f"parameter {key!r} takes at most {MAX_CONSTRAINT_CHARS} characters")
    if key == "json_schema":
        try:
            schema = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise ValueError(f"parameter {key!r} must be a JSON schema (a JSON object)") from None
        if not isinstance(schema, dict):
            raise ValueError(f"parameter {key!r} must be a JSON schema (a JSON object)")
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    elif key == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(text)
    elif key == "grammar":
        grammar = llguidance.LLMatcher.grammar_from_lark(text)
    else:
        raise ValueError(f"unknown constraint {key!r}")
    try:
        error = llguidance.LLMatcher.validate_grammar(grammar, None)
    except Exception as exc:  # llguidance raises for what it cannot even read
        error = type(exc).__name__
    if error:
        raise ValueError(f"parameter {key!r} is not valid: {_first_line(error)}")
    return grammar


def _first_line(message: str) -> str:
    """llguidance's reason, without the grammar listing it appends."""
    lines = []
    for line in message.strip().splitlines():
        if re.match(r"^\s*\d+ \|", line):
            break  # the listing of the grammar itself
        if line.strip() and line.strip() != "^":
            lines.append(line.strip())
    return " ".join(lines)[:300] or "it does not compile"
