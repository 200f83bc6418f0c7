"""The token bodies: ``POST /tokenize`` and ``POST /decode`` in and out, in TEI's keys.

``/tokenize`` takes ``{"inputs": text | [text, ...], "add_special_tokens": true,
"prompt_name": null, "model": null}`` and answers ``{"model", "tokens": [[{"id", "text",
"special", "start", "stop"}, ...], ...], "usage": {"prompt_tokens", "total_tokens"}}``: per text
its tokens, with ``[start, stop)`` character offsets in the prompt followed by the text.

``/decode`` takes ``{"ids": [id, ...] | [[id, ...], ...], "skip_special_tokens": true,
"model": null}`` and answers ``{"model", "texts": [text, ...]}``, one text per sequence.

Every key is checked: an unknown key or a value of the wrong type is a 400
(:class:`~batching.errors.InvalidRequest`). Pure functions over bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import orjson

from batching.documents import JSONObject, parse_object
from batching.errors import InferenceFailed, InvalidRequest, UnprocessableInput
from batching.models.items import DecodeItem, TokenizeItem, Tokens

__all__ = [
    "DecodeRequest",
    "TokenizeRequest",
    "check_ids",
    "encode_decoded",
    "encode_tokens",
    "json_object",
    "optional_bool",
    "optional_str",
    "parse_decode_request",
    "parse_tokenize_request",
    "texts_of",
    "usage_of",
]


def json_object(body: bytes, keys: Sequence[str], route: str) -> JSONObject:
    """The body as a JSON object with no key outside ``keys``.

    :raises InvalidRequest: not JSON, not an object, or an unknown key.
    """
    if not body.strip():
        raise InvalidRequest(f"the request body is empty: {route} takes a JSON object")
    document = parse_object(
        body,
        lambda exc: InvalidRequest(f"the request body is not valid JSON: {exc}"),
        lambda other: InvalidRequest(f"{route} takes a JSON object, not {type(other).__name__}"),
    )
    unknown = [key for key in document if key not in keys]
    if unknown:
        raise InvalidRequest(
            f"{route} takes no key {unknown[0]!r}; its keys: {', '.join(map(repr, keys))}"
        )
    return document


def optional_bool(document: Mapping[str, object], key: str, default: bool) -> bool:
    value = document.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key!r} must be true or false, not {type(value).__name__}")
    return value


def optional_str(document: Mapping[str, object], key: str) -> str | None:
    value = document.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{key!r} must be a string, not {type(value).__name__}")
    return value


def texts_of(document: Mapping[str, object]) -> list[str]:
    """``inputs``: one text, or a non-empty list of texts.

    :raises InvalidRequest: missing, empty, or not text.
    """
    if "inputs" not in document or document["inputs"] is None:
        raise InvalidRequest('the body needs "inputs": a text or a list of texts')
    inputs = document["inputs"]
    if isinstance(inputs, str):
        return [inputs]
    if not isinstance(inputs, list):
        raise InvalidRequest(
            f'"inputs" must be a text or a list of texts, not {type(inputs).__name__}'
        )
    if not inputs:
        raise InvalidRequest('"inputs" is an empty list')
    for index, text in enumerate(inputs):
        if not isinstance(text, str):
            raise InvalidRequest(f"inputs[{index}] is {type(text).__name__}, not a text")
    return inputs


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    model: str | None
    texts: list[str]
    add_special_tokens: bool
    prompt_name: str | None

    def items(self, prompt: str) -> list[TokenizeItem]:
        """The queue's items, with the prompt the request's ``prompt_name`` resolved to."""
        return [TokenizeItem(text, prompt, self.add_special_tokens) for text in self.texts]


TOKENIZE_KEYS = ("inputs", "add_special_tokens", "prompt_name", "model")


def parse_tokenize_request(body: bytes) -> TokenizeRequest:
    """:raises InvalidRequest: see the module's rules."""
    document = json_object(body, TOKENIZE_KEYS, "/tokenize")
    return TokenizeRequest(
        model=optional_str(document, "model"),
        texts=texts_of(document),
        add_special_tokens=optional_bool(document, "add_special_tokens", True),
        prompt_name=optional_str(document, "prompt_name"),
    )


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    model: str | None
    ids: list[tuple[int, ...]]
    skip_special_tokens: bool

    def items(self) -> list[DecodeItem]:
        return [DecodeItem(ids, self.skip_special_tokens) for ids in self.ids]


DECODE_KEYS = ("ids", "skip_special_tokens", "model")


def _is_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_decode_request(body: bytes) -> DecodeRequest:
    """``ids`` is one sequence of ids or a non-empty list of them (a sequence may be empty).

    :raises InvalidRequest: see the module's rules; an id that is not an int >= 0.
    """
    document = json_object(body, DECODE_KEYS, "/decode")
    ids = document.get("ids")
    if not isinstance(ids, list):
        raise InvalidRequest('the body needs "ids": a list of token ids, or a list of such lists')
    rows = [row for row in ids if isinstance(row, list)]
    nested = bool(ids) and len(rows) == len(ids)
    if rows and not nested:
        raise InvalidRequest('"ids" mixes ids and lists of ids')
    sequences = rows if nested else [ids]
    checked: list[tuple[int, ...]] = []
    for row, sequence in enumerate(sequences):
        for column, value in enumerate(sequence):
            if not _is_id(value):
                where = f"ids[{row}][{column}]" if nested else f"ids[{column}]"
                raise InvalidRequest(f"{where} is {value!r}: a token id is an integer >= 0")
        checked.append(tuple(value for value in sequence if _is_id(value)))
    return DecodeRequest(
        model=optional_str(document, "model"),
        ids=checked,
        skip_special_tokens=optional_bool(document, "skip_special_tokens", True),
    )


def check_ids(request: DecodeRequest, vocab_size: int | None, model: str) -> None:
    """Every id below the model's vocabulary size (when it says).

    :raises UnprocessableInput: naming the first id out of range and the size.
    """
    if vocab_size is None:
        return
    for row, sequence in enumerate(request.ids):
        for column, value in enumerate(sequence):
            if value >= vocab_size:
                raise UnprocessableInput(
                    f"token id {value} (sequence {row}, position {column}) is not in the "
                    f"vocabulary of model {model!r}, whose ids run from 0 to {vocab_size - 1}"
                )


def usage_of(counts: Sequence[int]) -> dict[str, int]:
    """The ``usage`` of an answer: the tokens of every text, special tokens and prompt
    included, as OpenAI's embeddings answer counts them."""
    total = sum(counts)
    return {"prompt_tokens": total, "total_tokens": total}


def _check_tokens(output: object) -> Tokens:
    if not isinstance(output, Tokens):
        raise InferenceFailed(f"the model answered a tokenize item with {type(output).__name__}")
    return output


def encode_tokens(model: str, outputs: Sequence[object]) -> bytes:
    """The ``/tokenize`` answer of the model's :class:`Tokens`, one per text."""
    texts = []
    counts = []
    for output in map(_check_tokens, outputs):
        texts.append(
            [
                {"id": id_, "text": text, "special": special, "start": start, "stop": stop}
                for id_, text, special, (start, stop) in zip(
                    output.ids, output.tokens, output.special, output.offsets, strict=True
                )
            ]
        )
        counts.append(len(output.ids))
    return orjson.dumps({"model": model, "tokens": texts, "usage": usage_of(counts)})


def encode_decoded(model: str, outputs: Sequence[object]) -> bytes:
    """The ``/decode`` answer: one text per sequence."""
    for output in outputs:
        if not isinstance(output, str):
            raise InferenceFailed(f"the model answered a decode item with {type(output).__name__}")
    return orjson.dumps({"model": model, "texts": list(outputs)})
