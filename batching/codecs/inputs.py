"""A model's named inputs, as its metadata declares them, and items made of them.

A model with one input gets each item as a value (a text, a row of numbers). A model whose
metadata declares several inputs gets each item as a dict of the inputs sent for it, by name:
a text-pair classifier declares ``text`` and ``text_pair`` and gets
``{"text": a, "text_pair": b}``. An input described with ``"optional": true`` may be left out.
An input whose entry says ``"content": "image"`` (or ``"audio"``) is media: its value is
``bytes``, decoded from base64 where the wire carries text (:mod:`.media`). A model whose
inputs each say ``"exclusive": true`` takes exactly one of them per item (an image or a text,
for a CLIP-style embedder). The core never looks inside an item, so batches still count items,
and split and re-join as they always do. Pure functions over the metadata dict: every door
shares them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batching.documents import listed, per_document
from batching.errors import InvalidRequest, UnprocessableInput
from batching.models.items import Item

from .media import media_bytes, media_kind

__all__ = [
    "InputSpec",
    "check_exclusive",
    "input_specs",
    "named_item",
    "required_names",
    "takes_pairs",
]

#: The inputs of a text-pair model (cross-encoder, NLI), as transformers names them.
PAIR_INPUTS = ("text", "text_pair")


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One declared input: its name, its v2 datatype, and whether a request may omit it;
    ``content``, the media kind of a bytes input (None: text or numbers); ``exclusive``, an
    item that sets it sets no other input."""

    name: str
    datatype: str = "BYTES"
    optional: bool = False
    content: str | None = None
    exclusive: bool = False


@per_document
def input_specs(metadata: Mapping[str, object]) -> list[InputSpec]:
    """The inputs ``metadata`` declares, in order; empty when it declares none. Read once per
    metadata (:func:`~batching.documents.per_document`): the list is shared, never change it."""
    specs = []
    for tensor in listed(metadata.get("inputs")):
        if not isinstance(tensor, Mapping) or "name" not in tensor:
            continue
        specs.append(
            InputSpec(
                name=str(tensor["name"]),
                datatype=str(tensor.get("datatype", "BYTES")),
                optional=bool(tensor.get("optional", False)),
                content=media_kind(tensor),
                exclusive=bool(tensor.get("exclusive", False)),
            )
        )
    return specs


def required_names(specs: Sequence[InputSpec]) -> list[str]:
    return [spec.name for spec in specs if not spec.optional]


def takes_pairs(metadata: Mapping[str, object]) -> bool:
    """Whether the model takes text pairs: it declares BYTES inputs ``text`` and
    ``text_pair`` (the second may be optional), and requires nothing else."""
    specs = {spec.name: spec for spec in input_specs(metadata)}
    if not all(name in specs and specs[name].datatype == "BYTES" for name in PAIR_INPUTS):
        return False
    return all(spec.optional or spec.name in PAIR_INPUTS for spec in specs.values())


def _names(specs: Sequence[InputSpec]) -> str:
    return ", ".join(repr(spec.name) for spec in specs)


def named_item(value: Item, specs: Sequence[InputSpec], where: str) -> dict[str, Item]:
    """One item for a model with several named inputs ``specs``: ``value`` is a dict of them
    by name (a lone value stands for the first input when every other one is optional).

    :param where: names the item in messages, e.g. ``inputs[3]``.
    :raises UnprocessableInput: unknown or missing inputs, or a text input that is not text.
    """
    if not isinstance(value, dict):
        if any(not spec.optional for spec in specs[1:]):
            raise UnprocessableInput(
                f"{where} is {type(value).__name__}; this model takes the named inputs "
                f"{_names(specs)}: send an object with them"
            )
        value = {specs[0].name: value}
    known = {spec.name for spec in specs}
    unknown = [name for name in value if name not in known]
    if unknown:
        raise UnprocessableInput(
            f"{where} has the unknown input {unknown[0]!r}; this model takes {_names(specs)}"
        )
    item: dict[str, Item] = {}
    for spec in specs:
        if spec.name not in value or value[spec.name] is None:
            if not spec.optional:
                raise UnprocessableInput(f"{where} lacks the input {spec.name!r}")
            continue
        field = value[spec.name]
        if spec.content is not None:
            field = media_bytes(field, spec.content, f"{where}.{spec.name}")
        elif spec.datatype == "BYTES" and not isinstance(field, str):
            raise UnprocessableInput(
                f"{where}.{spec.name} is {type(field).__name__}; this input is text"
            )
        item[spec.name] = field
    check_exclusive(item, specs, where)
    return item


def check_exclusive(item: Mapping[str, object], specs: Sequence[InputSpec], where: str) -> None:
    """Refuse an item that sets more than one input, or none, of a model whose inputs are
    exclusive (each item is one of them: an image or a text).

    :raises InvalidRequest: naming the inputs.
    """
    if not any(spec.exclusive for spec in specs):
        return
    sent = [spec.name for spec in specs if item.get(spec.name) is not None]
    if len(sent) != 1:
        raise InvalidRequest(
            f"{where} sets {', '.join(repr(name) for name in sent) or 'no input'}; each item of "
            f"this model is exactly one of {_names(specs)}"
        )
