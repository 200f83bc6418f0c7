"""The types of JSON documents: what orjson parses (:data:`JSONValue`, :data:`JSONObject`)
and what an answer writes (:data:`JSONOut`, whose read-only containers let any nesting of
lists, tuples and dicts fit). Pure: every layer may use them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

import orjson

__all__ = ["JSONObject", "JSONOut", "JSONOutObject", "JSONValue", "listed", "parse_object"]

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
