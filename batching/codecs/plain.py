"""The plain protocol: a text body, or JSON ``{"inputs": ...}``, in; ``{"outputs": [...]}`` out.

An item of a model with several named inputs is a JSON object of them, e.g.
``{"inputs": [{"text": "a", "text_pair": "b"}]}`` for a text-pair classifier.

Embedding options (:mod:`.embed_options`) go beside ``inputs`` as TEI sends them
(``{"inputs": [...], "prompt_name": "query", "truncate": false}``) or in an HF-style
``"parameters"`` object (``{"inputs": [...], "parameters": {"prompt_name": "query"}}``); any
other key is a 400, never ignored. An embedding answer says which texts were cut
(``"truncated": [false, true]``) and the tokens used (``"usage"``) when the model counts them.

``curl -d "some text"`` sends ``application/x-www-form-urlencoded``; a user typing that means
text. A body is therefore read as JSON when its content type says JSON, or when it has no
content type (or curl's form type) and starts with ``{`` or ``[`` after whitespace; a body read
as JSON that does not parse is a 400, never a text. Anything else is one text, except for a
model with a media input (``"content": "image"`` in its metadata, :mod:`.media`): a raw body
of that kind (``Content-Type: image/png``, or ``application/octet-stream``) is one item of
bytes (:func:`media_request`), and a JSON body's items are base64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from batching.documents import listed
from batching.errors import InvalidRequest, NotReady, UnprocessableInput
from batching.models.items import Item

from .inputs import InputSpec, named_item
from .media import media_body, media_bytes

__all__ = [
    "SNIFFED_TYPES",
    "PlainRequest",
    "check_inputs",
    "check_texts",
    "encode_embeddings",
    "encode_outputs",
    "media_request",
    "parse_inputs",
    "parse_request",
]

#: Content types that do not say what the body is (none, or what ``curl -d`` sends): a body of
#: one of them is JSON when it starts with ``{`` or ``[`` after whitespace, else text.
SNIFFED_TYPES = frozenset({"", "application/x-www-form-urlencoded"})


@dataclass(frozen=True, slots=True)
class PlainRequest:
    """A plain body: its inputs, one per item, and the option keys it set beside them (or in
    its ``parameters``), as sent."""

    inputs: Sequence[Item]
    options: dict[str, object] = field(default_factory=dict)


def parse_inputs(body: bytes, content_type: str) -> Sequence[Item]:
    """The request's inputs, one per item, in order (its options left aside).

    :raises InvalidRequest: empty body, bad JSON, not UTF-8, or no usable ``inputs``.
    """
    return parse_request(body, content_type).inputs


def parse_request(body: bytes, content_type: str) -> PlainRequest:
    """The request's inputs, one per item, in order, and its options.

    :raises InvalidRequest: empty body, bad JSON, not UTF-8, no usable ``inputs``, or a
        ``parameters`` that is not an object or repeats a key set beside it.
    """
    if not body.strip():
        raise InvalidRequest('the request body is empty: send text, or JSON {"inputs": ...}')
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return _inputs_from_json(_load_json(body))
    first = body.lstrip()[:1]
    if media_type in SNIFFED_TYPES and first in (b"{", b"["):
        sniffed = first.decode()
        document = _load_json(body, sniffed)
        try:
            return _inputs_from_json(document)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{exc}; {_as_text(sniffed)}") from None
    try:
        return PlainRequest([body.decode("utf-8")])
    except UnicodeDecodeError:
        raise InvalidRequest("the request body is not valid UTF-8 text") from None


def media_request(
    body: bytes, content_type: str, metadata: dict[str, object]
) -> PlainRequest | None:
    """A raw media body as one item, for a model whose metadata declares a media input of the
    body's kind: its bytes (a dict of them by input name for a model of several inputs);
    None for a body the usual parse reads (:func:`parse_request`).

    :raises InvalidRequest: a media body the model takes no input of, or an empty one.
    :raises NotReady: a media body before the model has said what it takes.
    """
    entries = [entry for entry in listed(metadata.get("inputs")) if isinstance(entry, dict)]
    media_type = content_type.partition(";")[0].strip().lower()
    if not entries:
        if media_type.partition("/")[0] in ("image", "audio", "video"):
            raise NotReady("the model is loading", retry_after=1.0)
        return None
    found = media_body(body, content_type, entries)
    if found is None:
        return None
    name, kind = found
    data = media_bytes(body, kind, "the request body")
    return PlainRequest([data if len(entries) == 1 else {name: data}])


def _load_json(body: bytes, sniffed: str | None = None) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if sniffed is None:
            raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
        raise InvalidRequest(
            f"the request body starts with {sniffed!r}, so it was read as JSON, and it is not "
            f"valid JSON: {exc}; {_as_text(sniffed)}"
        ) from None


def _as_text(first: str) -> str:
    return f"to send text that starts with {first!r}, set Content-Type: text/plain"


def _inputs_from_json(document: Any) -> PlainRequest:
    if not isinstance(document, dict):
        raise InvalidRequest('the JSON body must be an object like {"inputs": ["text", ...]}')
    if "inputs" not in document:
        raise InvalidRequest('the JSON body has no "inputs" key')
    inputs = document["inputs"]
    options = _options(document)
    if isinstance(inputs, list):
        if not inputs:
            raise InvalidRequest('"inputs" is an empty list')
        return PlainRequest(inputs, options)
    if inputs is None:
        raise InvalidRequest('"inputs" is null')
    return PlainRequest([inputs], options)


def _options(document: dict[str, object]) -> dict[str, object]:
    """Every key beside ``inputs``, with those of ``parameters`` (HF's shape) merged in."""
    options = {key: value for key, value in document.items() if key not in ("inputs", "parameters")}
    parameters = document.get("parameters")
    if parameters is None:
        return options
    if not isinstance(parameters, dict):
        raise InvalidRequest('"parameters" must be an object of options')
    for key, value in parameters.items():
        if key in options:
            raise InvalidRequest(f"{key!r} is set both beside inputs and in parameters")
        options[key] = value
    return options


def check_texts(inputs: Sequence[Item]) -> list[str]:
    """For text models: every input must be a string.

    :raises UnprocessableInput: naming the first input that is not.
    """
    texts: list[str] = []
    for index, item in enumerate(inputs):
        if not isinstance(item, str):
            raise UnprocessableInput(
                f"inputs[{index}] is {type(item).__name__}; this model takes text strings"
            )
        texts.append(item)
    return texts


def check_inputs(inputs: Sequence[Item], specs: Sequence[InputSpec]) -> Sequence[Item]:
    """The items for a model that declares the inputs ``specs``.

    With several inputs, every item is an object of them by name (``{"text": a,
    "text_pair": b}``; a lone text stands for the first input when the others are optional),
    and becomes a dict of the inputs sent. With one media input (``"content": "image"``),
    every item is base64 text (or bytes of a raw body) and becomes ``bytes``
    (:mod:`.media`). With one text input, every item must be a string. Otherwise the items
    pass as they are.

    :raises UnprocessableInput: naming the first item that does not fit.
    :raises InvalidRequest: a media item that is not base64 (:func:`.media.media_bytes`).
    """
    if len(specs) > 1:
        return [named_item(item, specs, f"inputs[{index}]") for index, item in enumerate(inputs)]
    if specs and specs[0].content is not None:
        # A base64 text, or an object naming the input ({"image": "<base64>"}): bytes.
        name = specs[0].name
        return [
            named_item(item, specs, f"inputs[{index}]")[name] for index, item in enumerate(inputs)
        ]
    if specs and specs[0].datatype == "BYTES":
        return check_texts(inputs)
    return inputs


def encode_outputs(model: str, outputs: list[object]) -> bytes:
    """``{"model": ..., "outputs": [...]}``; numpy arrays become lists."""
    return orjson.dumps(
        {"model": model, "outputs": outputs},
        option=orjson.OPT_SERIALIZE_NUMPY,
        default=_fallback,
    )


def encode_embeddings(
    model: str,
    vectors: Sequence[object],
    *,
    truncated: Sequence[bool] | None,
    tokens: int | None,
) -> bytes:
    """The answer to an embedding request: ``{"model", "outputs"}`` as for any other, plus
    ``"truncated"`` (per text, whether the model cut it) and ``"usage"`` (tokens used,
    prompts included) when they are known. ``vectors`` are arrays or base64 strings."""
    answer: dict[str, object] = {"model": model, "outputs": list(vectors)}
    if truncated is not None:
        answer["truncated"] = list(truncated)
    if tokens is not None:
        answer["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def _fallback(value: object) -> Any:
    # numpy scalars of types orjson does not know, tuples of arrays, and the like.
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    kind = type(value)
    if all(getattr(kind, name) is getattr(object, name) for name in ("__str__", "__repr__")):
        # "<Thing object at 0x7f...>" says nothing to the client but the server's memory
        # layout: a model output with no text of its own is the server's error (a 500).
        raise TypeError(f"a model output of type {type(value).__name__} has no JSON form")
    return str(value)
