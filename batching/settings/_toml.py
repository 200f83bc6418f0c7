"""A typed reader of parsed TOML tables: every key is checked as it is taken, and a bad value
becomes an error naming the file and the dotted key."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Final, TypeGuard

__all__ = ["MISSING", "Table", "is_int", "is_number", "show"]

#: What :meth:`Table.get` returns for a key the table does not have.
MISSING: Final = object()


def show(value: object) -> str:
    """A value as the TOML file spells it, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(show(item) for item in value) + "]"
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def is_int(value: object) -> TypeGuard[int]:
    # TOML booleans arrive as Python bools, which are ints too.
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


class Table:
    """One TOML table being read: every key is checked as it is taken, and any key left
    over at :meth:`finish` is unknown.

    :param data: the table as ``tomllib`` parsed it.
    :param file: the file, as messages should name it.
    :param path: the table's dotted path in ``file`` ("" for the whole file).
    :param raises: builds the exception a bad value raises, from its message.
    """

    def __init__(
        self,
        data: dict[str, object],
        file: str,
        path: str,
        *,
        raises: Callable[[str], Exception],
    ) -> None:
        self.data = data
        self.file = file
        self.path = path
        self.taken: set[str] = set()
        self._raises = raises

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str, value: object = MISSING) -> Exception:
        got = "" if value is MISSING else f", got {show(value)}"
        return self._raises(f"{self.file}: {self.where(key)}: {message}{got}")

    def get(self, key: str) -> Any:
        """The raw value at ``key``, or :data:`MISSING`."""
        self.taken.add(key)
        return self.data.get(key, MISSING)

    def integer(
        self, key: str, default: int, *, maximum: int | None = None, minimum: int = 1
    ) -> int:
        value = self.optional_integer(key, maximum=maximum, minimum=minimum)
        return default if value is None else value

    def optional_integer(
        self, key: str, *, maximum: int | None = None, minimum: int = 1
    ) -> int | None:
        value = self.get(key)
        if value is MISSING:
            return None
        if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise self.error(key, f"must be an integer {bound}", value)
        return int(value)

    def number(
        self, key: str, default: float, *, positive: bool = False, maximum: float | None = None
    ) -> float:
        value = self.get(key)
        if value is MISSING:
            return default
        ok = is_number(value) and (value > 0 if positive else value >= 0)
        if not ok or (maximum is not None and value > maximum):
            bound = f"{'> 0' if positive else '>= 0'}"
            if maximum is not None:
                bound += f" and at most {maximum:.15g}"
            raise self.error(key, f"must be a number {bound}", value)
        return float(value)

    def string(self, key: str, *, empty: bool = False) -> str | None:
        """A string (one that may be ``""`` with ``empty``); None when the key is missing."""
        value = self.get(key)
        if value is MISSING:
            return None
        if not isinstance(value, str) or not (value or empty):
            raise self.error(key, f"must be a{'' if empty else ' non-empty'} string", value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is MISSING:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "must be true or false", value)
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(key)
        if value is MISSING:
            return default
        if value not in choices:
            listed = ", ".join(json.dumps(choice) for choice in choices)
            raise self.error(key, f"must be one of {listed}", value)
        return str(value)

    def sizes(self, key: str, maximum: int | None = None) -> tuple[int, ...] | None:
        value = self.get(key)
        if value is MISSING:
            return None
        if not isinstance(value, list) or not all(is_int(item) for item in value):
            raise self.error(key, "must be a list of integers", value)
        for item in value:
            if item < 1 or (maximum is not None and item > maximum):
                bound = f"between 1 and max_batch_size ({maximum})" if maximum else ">= 1"
                raise self.error(key, f"every size must be {bound}", value)
        return tuple(value)

    def nested(self, data: dict[str, object], path: str) -> Table:
        """A table of the same file at ``path`` (an element of an array of tables)."""
        return Table(data, self.file, path, raises=self._raises)

    def table(self, key: str) -> Table | None:
        value = self.get(key)
        if value is MISSING:
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table ([{self.where(key)}])", value)
        return Table(value, self.file, self.where(key), raises=self._raises)

    def finish(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in self.taken:
                raise self.error(key, f"unknown key (known here: {', '.join(allowed)})")
