"""The types of JSON documents: what orjson parses (:data:`JSONValue`, :data:`JSONObject`)
and what an answer writes (:data:`JSONOut`, whose read-only containers let any nesting of
lists, tuples and dicts fit). Pure: every layer may use them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias, TypeVar

import orjson

__all__ = [
    "JSONObject",
    "JSONOut",
    "JSONOutObject",
    "JSONValue",
    "REMEMBERED",
    "listed",
    "parse_object",
    "per_document",
]

R = TypeVar("R")

#: How many documents a :func:`per_document` reading keeps (one per model served, and more).
REMEMBERED = 64

#: A parsed JSON value: what ``orjson.loads`` gives (narrowed with ``isinstance``).
JSONValue: TypeAlias = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
#: A parsed JSON object.
JSONObject: TypeAlias = dict[str, JSONValue]
#: A JSON value to write.
JSONOut: TypeAlias = str | int | float | bool | None | Sequence["JSONOut"] | Mapping[str, "JSONOut"]
#: A JSON object to write, built key by key.
JSONOutObject: TypeAlias = dict[str, JSONOut]


def listed(value: object) -> Sequence[object]:
    """``value`` when it is a JSON array (a list, or a tuple), else empty: how a key of a
    model's metadata or of a body is read as a list."""
    return value if isinstance(value, list | tuple) else ()


def per_document(read: Callable[[Mapping[str, object]], R]) -> Callable[[Mapping[str, object]], R]:
    """``read``, remembered per document object: for what a model's metadata says, which the
    doors read at every request, and which nothing changes in place once the model is loaded
    (a reload brings a new document). Only for such documents, and results nobody changes.

    The last :data:`REMEMBERED` documents are kept, each held so that its ``id`` is never
    another document's."""
    seen: dict[int, tuple[Mapping[str, object], R]] = {}

    def remembered(document: Mapping[str, object]) -> R:
        found = seen.get(id(document))
        if found is not None and found[0] is document:
            return found[1]
        value = read(document)
        if len(seen) >= REMEMBERED:
            seen.clear()
        seen[id(document)] = (document, value)
        return value

    remembered.__doc__ = read.__doc__
    remembered.__name__ = read.__name__
    return remembered


def parse_object(
    data: bytes | bytearray | memoryview | str,
    not_json: Callable[[orjson.JSONDecodeError], Exception],
    not_object: Callable[[JSONValue], Exception],
) -> JSONObject:
    """``data`` parsed as a JSON object: the one way a door reads one. ``not_json`` makes the
    error raised for what does not parse, ``not_object`` the one for another JSON value (each
    door words its own)."""
    try:
        parsed: JSONValue = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise not_json(exc) from None
    if not isinstance(parsed, dict):
        raise not_object(parsed)
    return parsed
