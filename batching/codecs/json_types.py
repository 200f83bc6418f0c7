"""How messages name the type of a JSON value a request sent where another was expected."""

from __future__ import annotations

__all__ = ["json_type"]


def json_type(value: object) -> str:
    """``value``'s JSON type as a message says it: null, a boolean, a number, a string, an
    array or an object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
