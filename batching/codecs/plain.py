"""The plain protocol: a text body, or JSON ``{"inputs": ...}``, in; ``{"outputs": [...]}`` out.

An item of a model with several named inputs is a JSON object of them, e.g.
``{"inputs": [{"text": "a", "text_pair": "b"}]}`` for a text-pair classifier.

``curl -d "some text"`` sends ``application/x-www-form-urlencoded``; a user typing that means
text. A body is therefore read as JSON when its content type says JSON, or when it has no
content type (or curl's form type) and starts with ``{`` or ``[`` after whitespace; a body read
as JSON that does not parse is a 400, never a text. Anything else is one text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from batching.errors import InvalidRequest, UnprocessableInput

from .inputs import InputSpec, named_item

__all__ = ["SNIFFED_TYPES", "check_inputs", "check_texts", "encode_outputs", "parse_inputs"]

#: Content types that do not say what the body is (none, or what ``curl -d`` sends): a body of
#: one of them is JSON when it starts with ``{`` or ``[`` after whitespace, else text.
SNIFFED_TYPES = frozenset({"", "application/x-www-form-urlencoded"})


def parse_inputs(body: bytes, content_type: str) -> list[Any]:
    """The request's inputs, one per item, in order.

    :raises InvalidRequest: empty body, bad JSON, not UTF-8, or no usable ``inputs``.
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
        return [body.decode("utf-8")]
    except UnicodeDecodeError:
        raise InvalidRequest("the request body is not valid UTF-8 text") from None


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


def _inputs_from_json(document: Any) -> list[Any]:
    if not isinstance(document, dict):
        raise InvalidRequest('the JSON body must be an object like {"inputs": ["text", ...]}')
    if "inputs" not in document:
        raise InvalidRequest('the JSON body has no "inputs" key')
    inputs = document["inputs"]
    if isinstance(inputs, list):
        if not inputs:
            raise InvalidRequest('"inputs" is an empty list')
        return inputs
    if inputs is None:
        raise InvalidRequest('"inputs" is null')
    return [inputs]


def check_texts(inputs: list[Any]) -> list[str]:
    """For text models: every input must be a string.

    :raises UnprocessableInput: naming the first input that is not.
    """
    for index, item in enumerate(inputs):
        if not isinstance(item, str):
            raise UnprocessableInput(
                f"inputs[{index}] is {type(item).__name__}; this model takes text strings"
            )
    return inputs


def check_inputs(inputs: list[Any], specs: Sequence[InputSpec]) -> list[Any]:
    """The items for a model that declares the inputs ``specs``.

    With several inputs, every item is an object of them by name (``{"text": a,
    "text_pair": b}``; a lone text stands for the first input when the others are optional),
    and becomes a dict of the inputs sent. With one text input, every item must be a string.
    Otherwise the items pass as they are.

    :raises UnprocessableInput: naming the first item that does not fit.
    """
    if len(specs) > 1:
        return [named_item(item, specs, f"inputs[{index}]") for index, item in enumerate(inputs)]
    if specs and specs[0].datatype == "BYTES":
        return check_texts(inputs)
    return inputs


def encode_outputs(model: str, outputs: list[Any]) -> bytes:
    """``{"model": ..., "outputs": [...]}``; numpy arrays become lists."""
    return orjson.dumps(
        {"model": model, "outputs": outputs},
        option=orjson.OPT_SERIALIZE_NUMPY,
        default=_fallback,
    )


def _fallback(value: Any) -> Any:
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
