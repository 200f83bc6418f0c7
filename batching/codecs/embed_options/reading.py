"""Reading the embedding options: the ones a request set (:class:`EmbedOptions`), by the name
every door uses (or the door's own spelling), each checked for its type; 400 for an unknown
one or a wrong value (:class:`OptionError`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, cast

from batching.errors import InvalidRequest
from batching.models.items import Encoding

from ..json_types import json_type

__all__ = [
    "BASE64_SUFFIX",
    "COMPACT",
    "INPUT_TYPE_ALIASES",
    "OPTION_NAMES",
    "WIRE_ENCODINGS",
    "EmbedOptions",
    "OptionError",
    "TruncationDirection",
    "parse_encoding",
    "read_options",
    "refuse_dense_only",
]

#: Every option a request may set, by its name on the plain, v2 and gRPC doors.
OPTION_NAMES = (
    "prompt_name",
    "input_type",
    "truncate",
    "truncation_direction",
    "dimensions",
    "encoding",
)

#: The compact encodings: integer vectors the model quantizes.
COMPACT: tuple[Encoding, ...] = ("int8", "uint8", "binary", "ubinary")
BASE64_SUFFIX = "+base64"
#: What ``encoding`` (``encoding_format``) may say.
WIRE_ENCODINGS: tuple[str, ...] = (
    "float",
    "base64",
    *COMPACT,
    *(name + BASE64_SUFFIX for name in COMPACT),
)

#: ``input_type`` values that name a prompt by another name (Cohere's, Voyage's): tried in
#: order after the prompt of the value's own name.
INPUT_TYPE_ALIASES: dict[str, tuple[str, ...]] = {
    "document": ("document", "passage", "doc"),
    "passage": ("passage", "document"),
    "search_document": ("document", "passage", "search_document"),
    "search_query": ("query", "search_query"),
    "query": ("query",),
}

TruncationDirection = Literal["left", "right"]


class OptionError(InvalidRequest):
    """An option the server refuses (400), naming it as the request spelt it (``param``), as
    OpenAI's error document does."""

    def __init__(self, message: str, *, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """The options one request set; None (or the default) where it set none."""

    prompt_name: str | None = None
    input_type: str | None = None
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None
    dimensions: int | None = None
    encoding: Encoding = "float"
    #: Base64 of the vector's bytes, instead of a JSON list of numbers.
    base64: bool = False

    @property
    def wire_encoding(self) -> str:
        """The encoding as the request spelt it (``float``, ``base64``, ``int8+base64``...)."""
        if self.encoding == "float":
            return "base64" if self.base64 else "float"
        return self.encoding + (BASE64_SUFFIX if self.base64 else "")


def _string(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise OptionError(f"{name} must be a non-empty string, not {json_type(value)}", param=name)
    return value


def _boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be true or false, not {value!r}", param=name)
    return value


def parse_encoding(name: str, value: object) -> tuple[Encoding, bool]:
    """An ``encoding`` value as (the model's encoding, whether base64).

    :raises InvalidRequest: naming ``name`` and the values it may take.
    """
    if not isinstance(value, str) or value not in WIRE_ENCODINGS:
        raise OptionError(
            f"{name} must be one of {', '.join(WIRE_ENCODINGS)}, not {value!r}", param=name
        )
    if value == "base64":
        return "float", True
    encoding, _, suffix = value.partition("+")
    return cast(Encoding, encoding), bool(suffix)


def _dimensions(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive integer, not {value!r}", param=name)
    return value


def read_options(
    values: Mapping[str, object],
    *,
    where: str,
    names: Mapping[str, str] | None = None,
    ignore: Iterable[str] = (),
) -> EmbedOptions:
    """The options in ``values`` (a request's option keys), each checked for its type.

    :param where: what holds them, for messages ("the request's parameters").
    :param names: the door's own spelling of an option (``{"encoding_format": "encoding"}``);
        the spelling in messages is the door's.
    :param ignore: keys of ``values`` that are not options (the door's own fields).
    :raises InvalidRequest: an unknown key (listing the known ones) or a wrong value.
    """
    spelling = {option: option for option in OPTION_NAMES}
    for wire, option in (names or {}).items():
        spelling.pop(option, None)
        spelling[wire] = option
    skipped = set(ignore)
    found: dict[str, tuple[str, object]] = {}
    for key, value in values.items():
        if key in skipped:
            continue
        meant = spelling.get(key)
        if meant is None:
            known = ", ".join(sorted(spelling))
            raise OptionError(
                f"{where} has the unknown option {key!r}; the options are {known}",
                param=key,
                code="unknown_parameter",
            )
        if value is None:
            continue
        found[meant] = (key, value)
    read = EmbedOptions()
    if "prompt_name" in found:
        read = replace(read, prompt_name=_string(*found["prompt_name"]))
    if "input_type" in found:
        read = replace(read, input_type=_string(*found["input_type"]))
    if "truncate" in found:
        read = replace(read, truncate=_boolean(*found["truncate"]))
    if "truncation_direction" in found:
        key, value = found["truncation_direction"]
        if value != "left" and value != "right":
            raise OptionError(f"{key} must be 'left' or 'right', not {value!r}", param=key)
        read = replace(read, truncation_direction=value)
    if "dimensions" in found:
        read = replace(read, dimensions=_dimensions(*found["dimensions"]))
    if "encoding" in found:
        encoding, base64 = parse_encoding(*found["encoding"])
        read = replace(read, encoding=encoding, base64=base64)
    return read


def refuse_dense_only(options: EmbedOptions, *, dimensions: str, encoding: str) -> None:
    """Refuse the options that shape pooled (dense) vectors alone, ``dimensions`` and an
    ``encoding`` other than float, for vectors of another kind (per-token, sparse).

    :param dimensions: the 400's message for ``dimensions``.
    :param encoding: the 400's message for ``encoding``.
    :raises OptionError: naming the option.
    """
    if options.dimensions is not None:
        raise OptionError(dimensions, param="dimensions")
    if options.encoding != "float" or options.base64:
        raise OptionError(encoding, param="encoding")
