"""The request parameters a task takes, declared by the model and checked by every door.

A pipeline task declares what it takes as :class:`Param` values (``top_k``,
``candidate_labels``, ``max_new_tokens``, ...). Its metadata carries them under
:data:`PARAMETERS_KEY` as plain JSON (:meth:`Param.describe`), so a door, the model
repository's defaults and a client all read the same declaration. A door checks a request's
``parameters`` with :func:`check_parameters` (an unknown key or a wrong type is an
:class:`InvalidParameter` naming it) and sends :class:`TaskItem` items: the input with the
request's checked parameters, hashable, so a model can group a batch by them
(:func:`group_by_parameters`) and run items whose result would change apart.

Pure data: no torch, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "PARAMETERS_KEY",
    "InvalidParameter",
    "Param",
    "ParamType",
    "Parameters",
    "TaskItem",
    "check_parameters",
    "declared_parameters",
    "group_by_parameters",
]

#: The metadata key under which a task lists the parameters it takes:
#: ``{"top_k": {"type": "integer", "default": 1, "minimum": 1}, ...}``.
PARAMETERS_KEY = "parameters"

#: A parameter's JSON type: ``strings`` is a list of strings (a single string is taken as a
#: list of one, as the pipelines do for ``candidate_labels`` and ``stop``).
ParamType = Literal["integer", "number", "boolean", "string", "strings"]

#: Checked parameters, sorted by name: hashable, so items with equal ones group together.
Parameters = tuple[tuple[str, Any], ...]


class InvalidParameter(ValueError):
    """A request parameter the task does not take, or a value it cannot take; the message
    names the key and says what is allowed (a 400 on every door)."""


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter a task takes.

    :param name: the key in a request's ``parameters``.
    :param type: its JSON type (see :data:`ParamType`).
    :param default: used when a request does not set it (None: the task's own default).
    :param required: a request must set it (or the repository's defaults must).
    :param minimum: the lowest number allowed (integer and number types).
    :param maximum: the highest number allowed.
    :param choices: the only strings allowed (string type).
    :param batch_neutral: items that differ only in this parameter may share one forward
        pass (it changes post-processing alone, e.g. ``top_k`` of a classifier).
    :param doc: one line for the README table and the metadata.
    """

    name: str
    type: ParamType
    default: Any = None
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    batch_neutral: bool = False
    doc: str = ""

    def describe(self) -> dict[str, Any]:
        """The declaration as plain JSON, for metadata."""
        described: dict[str, Any] = {"type": self.type}
        for key in ("default", "minimum", "maximum"):
            value = getattr(self, key)
            if value is not None:
                described[key] = list(value) if isinstance(value, tuple) else value
        if self.required:
            described["required"] = True
        if self.choices is not None:
            described["choices"] = list(self.choices)
        if self.batch_neutral:
            described["batch_neutral"] = True
        if self.doc:
            described["doc"] = self.doc
        return described

    @classmethod
    def from_description(cls, name: str, described: Mapping[str, Any]) -> Param:
        """The inverse of :meth:`describe` (what a door reads from a model's metadata)."""
        choices = described.get("choices")
        default = described.get("default")
        return cls(
            name=name,
            type=described["type"],
            default=tuple(default) if isinstance(default, list) else default,
            required=bool(described.get("required", False)),
            minimum=described.get("minimum"),
            maximum=described.get("maximum"),
            choices=tuple(choices) if choices is not None else None,
            batch_neutral=bool(described.get("batch_neutral", False)),
            doc=str(described.get("doc", "")),
        )

    def check(self, value: Any) -> Any:
        """``value`` as this parameter holds it (lists become tuples).

        :raises InvalidParameter: a value of the wrong type or out of range.
        """
        checked = _typed(self, value)
        if isinstance(checked, int | float) and not isinstance(checked, bool):
            if self.minimum is not None and checked < self.minimum:
                raise InvalidParameter(f"parameter {self.name!r} must be >= {self.minimum}")
            if self.maximum is not None and checked > self.maximum:
                raise InvalidParameter(f"parameter {self.name!r} must be <= {self.maximum}")
        if self.choices is not None and checked not in self.choices:
            raise InvalidParameter(
                f"parameter {self.name!r} must be one of {', '.join(map(repr, self.choices))}"
            )
        return checked


def _typed(param: Param, value: Any) -> Any:
    wanted = {
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "string": "a string",
        "strings": "a string or a list of strings",
    }[param.type]
    if param.type == "boolean" and isinstance(value, bool):
        return value
    if param.type == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if param.type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
    if param.type == "string" and isinstance(value, str):
        return value
    if param.type == "strings":
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            return tuple(value)
    raise InvalidParameter(f"parameter {param.name!r} must be {wanted}")


def declared_parameters(metadata: Mapping[str, Any]) -> dict[str, Param]:
    """The parameters a model's metadata declares (none: an empty dict)."""
    described = metadata.get(PARAMETERS_KEY) or {}
    return {name: Param.from_description(name, spec) for name, spec in described.items()}


def check_parameters(
    declared: Mapping[str, Param],
    given: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> Parameters:
    """A request's parameters checked against the task's declaration.

    :param declared: what the task takes (:func:`declared_parameters`).
    :param given: what the request set.
    :param defaults: server-wide values (the model repository's) for keys the request did not
        set; checked like the request's.
    :returns: every parameter set by the request or the defaults, checked, sorted by name.
        Declared defaults are not filled in: the task applies its own.
    :raises InvalidParameter: an unknown key (the message lists the known ones), a wrong type,
        or a required parameter missing.
    """
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise InvalidParameter(f"unknown parameter {unknown[0]!r}; this model takes: {known}")
    merged = {**(defaults or {}), **given}
    checked = {name: declared[name].check(value) for name, value in merged.items()}
    for name, param in declared.items():
        if param.required and name not in checked:
            raise InvalidParameter(f"parameter {name!r} is required by this model")
    return tuple(sorted(checked.items()))


@dataclass(frozen=True, slots=True)
class TaskItem:
    """One input of a task with its request's checked parameters.

    :param input: the input as the task takes it: a text, a text pair dict, or ``bytes`` of an
        image or audio (never a path or a URL).
    :param parameters: from :func:`check_parameters`.
    """

    input: Any
    parameters: Parameters = ()

    def get(self, name: str, default: Any = None) -> Any:
        for key, value in self.parameters:
            if key == name:
                return value
        return default


def group_by_parameters(
    items: Iterable[Any], neutral: Iterable[str] = ()
) -> dict[Parameters, list[int]]:
    """The positions of ``items`` grouped by the parameters that change a forward pass (all
    but ``neutral`` ones); plain inputs (not :class:`TaskItem`) have none. Groups keep the
    items' order, so a model runs each group as one batch and puts the answers back."""
    skip = frozenset(neutral)
    groups: dict[Parameters, list[int]] = {}
    for index, item in enumerate(items):
        key: Parameters = ()
        if isinstance(item, TaskItem):
            key = tuple((k, v) for k, v in item.parameters if k not in skip)
        groups.setdefault(key, []).append(index)
    return groups
