"""Per-request embedding options, the same on every door: what a request may ask of an
embedding model (an instruction prompt, the truncation rule and side, fewer dimensions, a
compact encoding), checked against what the model says it applies (its ``"embedding"``
metadata, :data:`~batching.models.items.EMBEDDING_KEY`), and turned into the items its queue
takes.

The options, by the name every door uses (the OpenAI door spells ``encoding`` as
``encoding_format``):

- ``prompt_name``: a key of the model's ``prompts`` (``config_sentence_transformers.json``);
  prepended as sentence-transformers' ``encode(prompt_name=...)`` does. Left out, the model's
  default prompt applies (``default_prompt_name``, ``--default-prompt-name``/``--default-prompt``).
- ``input_type``: Cohere's and Voyage's spelling of the same choice: the prompt of that name,
  or for ``document``/``search_document`` the ``document`` or ``passage`` prompt, for
  ``search_query`` the ``query`` prompt. Given with ``prompt_name``, both must pick one prompt.
- ``truncate``: ``true`` (the server's default unless ``--no-truncate``) cuts a text longer
  than the model's ``max_seq_length``; ``false`` refuses it (413 naming the limit and the
  text's token count).
- ``truncation_direction``: ``right`` (the default) keeps the start, ``left`` the end.
- ``dimensions``: keep the first N dimensions (re-normalised for unit vectors).
- ``encoding``: ``float``, ``base64`` (little-endian float32 bytes), ``int8``, ``uint8``,
  ``binary``, ``ubinary`` (sentence-transformers' ``quantize_embeddings`` precisions), or one
  of those four followed by ``+base64`` (``int8+base64``: the same bytes, base64-encoded).

Anything else is a 400 naming it, never ignored; so is an option the model cannot apply
(a model without ``"embedding"`` metadata takes only ``dimensions``, ``float`` and ``base64``,
which the doors apply themselves). Pure functions over plain values and numpy.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from batching.errors import InferenceFailed, InvalidRequest, PayloadTooLarge
from batching.models.items import EMBEDDING_KEY, EmbedItem, Encoding

from .capability import max_seq_length

__all__ = [
    "BASE64_SUFFIX",
    "COMPACT",
    "INPUT_TYPE_ALIASES",
    "OPTION_NAMES",
    "OptionError",
    "WIRE_ENCODINGS",
    "EmbedOptions",
    "EmbedPlan",
    "TextTooLong",
    "embedding_info",
    "encode_vector",
    "plan_embedding",
    "parse_encoding",
    "read_options",
    "refused_text",
    "too_long",
    "truncated_flags",
    "vectors_of",
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


class TextTooLong(PayloadTooLarge):
    """A text over the model's length, with ``truncate: false`` (413)."""


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


def _type_name(value: Any) -> str:
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
    return type(value).__name__


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise OptionError(f"{name} must be a non-empty string, not {_type_name(value)}", param=name)
    return value


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be true or false, not {value!r}", param=name)
    return value


def parse_encoding(name: str, value: Any) -> tuple[Encoding, bool]:
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


def _dimensions(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive integer, not {value!r}", param=name)
    return value


def read_options(
    values: Mapping[str, Any],
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
    found: dict[str, Any] = {}
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
    kwargs: dict[str, Any] = {}
    if "prompt_name" in found:
        kwargs["prompt_name"] = _string(*found["prompt_name"])
    if "input_type" in found:
        kwargs["input_type"] = _string(*found["input_type"])
    if "truncate" in found:
        kwargs["truncate"] = _boolean(*found["truncate"])
    if "truncation_direction" in found:
        key, value = found["truncation_direction"]
        if value not in ("left", "right"):
            raise OptionError(f"{key} must be 'left' or 'right', not {value!r}", param=key)
        kwargs["truncation_direction"] = value
    if "dimensions" in found:
        kwargs["dimensions"] = _dimensions(*found["dimensions"])
    if "encoding" in found:
        kwargs["encoding"], kwargs["base64"] = parse_encoding(*found["encoding"])
    return EmbedOptions(**kwargs)


def embedding_info(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The model's ``"embedding"`` metadata, or None when it declares none."""
    info = metadata.get(EMBEDDING_KEY)
    return info if isinstance(info, Mapping) else None


def _first_output(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    outputs = metadata.get("outputs") or []
    first = outputs[0] if outputs else None
    return first if isinstance(first, Mapping) else None


def _width(metadata: Mapping[str, Any]) -> int | None:
    output = _first_output(metadata)
    shape = output.get("shape") if output is not None else None
    width = shape[-1] if isinstance(shape, list) and shape else None
    return width if isinstance(width, int) and not isinstance(width, bool) and width > 0 else None


def _normalized(metadata: Mapping[str, Any], info: Mapping[str, Any] | None) -> bool:
    if info is not None and isinstance(info.get("normalized"), bool):
        return bool(info["normalized"])
    output = _first_output(metadata)
    return output is not None and output.get("normalized") is True


@dataclass(frozen=True, slots=True)
class EmbedPlan:
    """What the door sends and how it shapes the answer, for one request."""

    #: One per text: the text itself (the model's defaults) or an :class:`EmbedItem`.
    items: list[str | EmbedItem]
    options: EmbedOptions
    #: Whether an over-long text is cut (True) or refused (False).
    truncate: bool
    #: The model's length in tokens, when it declares one: texts over it are truncated.
    max_seq_length: int | None
    #: ``dimensions`` the door applies itself (float vectors of models that do not).
    door_dimensions: int | None
    normalized: bool
    #: Whether the model declares ``"embedding"`` metadata (usage and truncation are known).
    described: bool = False

    def token_limit(self, at_least: int = 0) -> int | None:
        """The ``limit`` to count each text's length with: one past the model's length, so
        that a count over it says the text was truncated."""
        if self.max_seq_length is None:
            return at_least or None
        return max(self.max_seq_length + 1, at_least)


def _not_applied(model: str, option: str, value: Any, why: str) -> OptionError:
    return OptionError(f"model {model!r} cannot apply {option}={value!r}: {why}", param=option)


def _resolve_prompt(options: EmbedOptions, info: Mapping[str, Any], model: str) -> str | None:
    """The prompt text the request asks for, or None for the model's default."""
    prompts = info.get("prompts") or {}
    if not isinstance(prompts, Mapping):
        prompts = {}
    known = ", ".join(repr(name) for name in prompts) or "none"
    chosen: str | None = None
    if options.prompt_name is not None:
        if options.prompt_name not in prompts:
            raise OptionError(
                f"model {model!r} has no prompt named {options.prompt_name!r}; its prompts: "
                f"{known}",
                param="prompt_name",
            )
        chosen = options.prompt_name
    if options.input_type is not None:
        candidates = (options.input_type, *INPUT_TYPE_ALIASES.get(options.input_type, ()))
        by_type = next((name for name in candidates if name in prompts), None)
        if by_type is None:
            raise OptionError(
                f"model {model!r} has no prompt for input_type {options.input_type!r}; its "
                f"prompts: {known}",
                param="input_type",
            )
        if chosen is not None and chosen != by_type:
            raise OptionError(
                f"prompt_name {chosen!r} and input_type {options.input_type!r} choose "
                "different prompts; send one of them",
                param="input_type",
            )
        chosen = by_type
    return None if chosen is None else str(prompts[chosen])


def plan_embedding(
    texts: Sequence[str],
    options: EmbedOptions,
    metadata: Mapping[str, Any],
    *,
    model: str,
    truncate_default: bool = True,
    encoding_name: str = "encoding",
) -> EmbedPlan:
    """The items for ``texts`` with ``options``, given the model's ``metadata``.

    A request whose options are all the model's defaults sends the texts themselves (the
    fast path); any other sends one :class:`EmbedItem` per text, its prompt resolved.

    :param encoding_name: the door's name of ``encoding`` (``encoding_format``), for messages.
    :raises OptionError: an option the model cannot apply, naming it; an unknown prompt
        name, listing the model's prompts.
    """
    info = embedding_info(metadata)
    width = _width(metadata)
    normalized = _normalized(metadata, info)
    truncate = truncate_default if options.truncate is None else options.truncate
    _check_dimensions(options.dimensions, width, normalized, model)
    if info is None:
        return _plan_undescribed(texts, options, model, normalized, encoding_name)

    outputs = info.get("outputs") or ["dense"]
    if "dense" not in outputs:
        raise InvalidRequest(f"model {model!r} does not return dense embeddings")
    prompt = _resolve_prompt(options, info, model)
    directions = info.get("truncation_directions") or ["right"]
    direction = options.truncation_direction or "right"
    if direction not in directions:
        raise _not_applied(
            model, "truncation_direction", direction, f"it truncates {', '.join(directions)}"
        )
    encodings = info.get("encodings") or ["float"]
    if options.encoding not in encodings:
        raise _not_applied(
            model, encoding_name, options.wire_encoding, f"its encodings are {', '.join(encodings)}"
        )
    max_length = max_seq_length(metadata)

    compact = options.encoding != "float"
    # Shortening float vectors stays the door's (the fast path keeps plain strings); a compact
    # encoding quantizes after shortening, so the model does both.
    model_dimensions = options.dimensions if compact and options.dimensions != width else None
    door_dimensions = None if compact else options.dimensions
    default_prompt = info.get("default_prompt") or ""
    items: list[str | EmbedItem]
    if (prompt is None or prompt == default_prompt) and direction == "right" and not compact:
        items = list(texts)
    else:
        resolved = default_prompt if prompt is None else prompt
        items = [
            EmbedItem(
                text,
                prompt=str(resolved),
                truncate_left=direction == "left",
                dimensions=model_dimensions,
                encoding=options.encoding,
            )
            for text in texts
        ]
    return EmbedPlan(
        items=items,
        options=options,
        truncate=truncate,
        max_seq_length=max_length,
        door_dimensions=door_dimensions,
        normalized=normalized,
        described=True,
    )


def _plan_undescribed(
    texts: Sequence[str], options: EmbedOptions, model: str, normalized: bool, encoding_name: str
) -> EmbedPlan:
    why = "it declares no embedding options"
    for name in ("prompt_name", "input_type", "truncation_direction", "truncate"):
        value = getattr(options, name)
        if value is not None:
            raise _not_applied(model, name, value, why)
    if options.encoding != "float":
        raise _not_applied(model, encoding_name, options.wire_encoding, why)
    return EmbedPlan(
        items=list(texts),
        options=options,
        truncate=True,
        max_seq_length=None,
        door_dimensions=options.dimensions,
        normalized=normalized,
    )


def _check_dimensions(
    dimensions: int | None, width: int | None, normalized: bool, model: str
) -> None:
    if dimensions is None or width is None or dimensions == width:
        return
    if dimensions > width:
        raise OptionError(
            f"dimensions is {dimensions}, but model {model!r} has {width}-dimensional embeddings",
            param="dimensions",
        )
    if not normalized:
        raise OptionError(
            f"model {model!r} does not normalise its embeddings, so they cannot be shortened "
            f"to {dimensions} dimensions; leave dimensions out, or set it to {width}",
            param="dimensions",
            code="dimensions_not_supported",
        )


def truncated_flags(plan: EmbedPlan, lengths: Sequence[int] | None) -> list[bool] | None:
    """Which texts the model will cut, from each one's length before truncation (counted
    with :meth:`EmbedPlan.token_limit`); None when the model's length is not known."""
    limit = plan.max_seq_length
    if limit is None or lengths is None:
        return None
    return [length > limit for length in lengths]


def refused_text(plan: EmbedPlan, flags: Sequence[bool] | None) -> int | None:
    """The first text over the model's length when the request does not allow cutting it."""
    if plan.truncate or not flags or not any(flags):
        return None
    return list(flags).index(True)


def too_long(plan: EmbedPlan, index: int, tokens: int) -> TextTooLong:
    """The 413 of text ``index``, ``tokens`` long, with ``truncate: false``."""
    return TextTooLong(
        f"input {index} has {tokens} tokens, over the model's limit of {plan.max_seq_length} "
        "tokens (prompt and special tokens included); shorten it, or send truncate: true to "
        "have it cut"
    )


def vectors_of(outputs: Iterable[Any], plan: EmbedPlan, model: str) -> list[np.ndarray]:
    """The model's outputs as 1-D vectors: float32 shortened to the door's ``dimensions``
    (and re-normalised for unit vectors), or the int8/uint8 vectors of a compact encoding.

    :raises InferenceFailed: an output is not one vector of the asked type.
    :raises OptionError: ``dimensions`` cannot be honoured (the width the metadata did not
        say).
    """
    compact = plan.options.encoding != "float"
    wanted = {"int8": np.int8, "binary": np.int8, "uint8": np.uint8, "ubinary": np.uint8}
    vectors = []
    for index, output in enumerate(outputs):
        if compact:
            vector = np.asarray(output)
            dtype = np.dtype(wanted[plan.options.encoding])
            if vector.dtype != dtype:
                raise InferenceFailed(
                    f"model {model!r} returned {vector.dtype} for input {index}, not the "
                    f"{dtype} of encoding {plan.options.encoding!r}"
                )
        else:
            vector = np.asarray(output, dtype=np.float32)
        if vector.ndim != 1:
            raise InferenceFailed(
                f"model {model!r} returned an output of shape {list(vector.shape)} for "
                f"input {index}, not one embedding vector"
            )
        dimensions = plan.door_dimensions
        if dimensions is not None and dimensions != vector.shape[0]:
            _check_dimensions(dimensions, int(vector.shape[0]), plan.normalized, model)
            vector = vector[:dimensions]
            norm = float(np.linalg.norm(vector))
            if norm > 0:
                vector = (vector / norm).astype(np.float32)
        vectors.append(np.ascontiguousarray(vector))
    return vectors


def encode_vector(vector: np.ndarray, as_base64: bool) -> Any:
    """One vector for a JSON answer: a numpy array (orjson writes it as a list) or the
    base64 of its little-endian bytes (float32, or the int8/uint8 bytes as they are)."""
    if not as_base64:
        return vector
    if vector.dtype.kind == "f":
        vector = vector.astype("<f4", copy=False)
    return base64.b64encode(vector.tobytes()).decode("ascii")
