"""The ``POST /embed_sparse`` body, as text-embeddings-inference (TEI) takes and answers it.

Request: ``{"inputs": str | [str], "model"?: name, "truncate"?: bool,
"truncation_direction"?: "right" | "left", "prompt_name"?: str | null,
"return_tokens"?: bool}``. Any other key is a 400, as is an option of the wrong type, an
unknown direction or a prompt name the model does not have: an option the server would not
apply is never silently ignored.

Answer: per text, the non-zero entries of its sparse vector, ``[{"index": i, "value": v}]``
with ``"token"`` (the vocabulary entry) when ``return_tokens`` is true; indices ascending.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from batching.errors import InvalidRequest, PayloadTooLarge
from batching.models.items import EMBEDDING_KEY, EmbedItem, SparseVector

from .plain import check_texts

__all__ = [
    "KEYS",
    "OPTIONS",
    "max_length_of",
    "options_request",
    "SparseRequest",
    "check_lengths",
    "encode_sparse",
    "parse_sparse_request",
    "serves_sparse",
    "sparse_items",
]

#: The options that change how a text is embedded (also v2 request parameters).
OPTIONS = ("truncate", "truncation_direction", "prompt_name")
#: Every key the body may hold.
KEYS = ("inputs", "model", *OPTIONS, "return_tokens")
_DIRECTIONS = ("right", "left")


@dataclass(frozen=True, slots=True)
class SparseRequest:
    """A parsed ``/embed_sparse`` body.

    :param truncate: cut texts over the model's max length; False: such a text is a 413;
        None: the server's default (``--no-truncate`` makes it False).
    """

    texts: list[str]
    model: str | None = None
    truncate: bool | None = None
    truncate_left: bool = False
    prompt_name: str | None = None
    return_tokens: bool = False


def _flag(document: Mapping[str, Any], key: str, default: bool | None) -> bool | None:
    value = document.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f'"{key}" must be true or false, not {type(value).__name__}')
    return value


def parse_sparse_request(body: bytes) -> SparseRequest:
    """Parse and check a body (the prompt name is checked against the model later).

    :raises InvalidRequest: not a JSON object, unknown keys, missing or empty ``inputs``,
        options of the wrong type or value.
    :raises UnprocessableInput: an input that is not a string.
    """
    if not body.strip():
        raise InvalidRequest('the request body is empty: send JSON {"inputs": ["text", ...]}')
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidRequest('the JSON body must be an object like {"inputs": ["text", ...]}')
    unknown = sorted(str(key) for key in document if key not in KEYS)
    if unknown:
        raise InvalidRequest(
            f"unknown option {', '.join(repr(key) for key in unknown)}; "
            f"/embed_sparse takes {', '.join(KEYS)}"
        )
    if "inputs" not in document or document["inputs"] is None:
        raise InvalidRequest('the JSON body has no "inputs"')
    inputs = document["inputs"]
    texts = inputs if isinstance(inputs, list) else [inputs]
    if not texts:
        raise InvalidRequest('"inputs" is an empty list')
    model = document.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidRequest('"model" must be the name of a served model')
    return options_request(
        check_texts(texts),
        document,
        model=model,
        return_tokens=bool(_flag(document, "return_tokens", False)),
    )


def options_request(
    texts: list[Any],
    options: Mapping[str, Any],
    *,
    model: str | None = None,
    return_tokens: bool = False,
) -> SparseRequest:
    """``texts`` with the embedding options of ``options`` (:data:`OPTIONS`; other keys are
    not looked at): the body of ``/embed_sparse``, or a v2 request's parameters.

    :raises InvalidRequest: an option of the wrong type or value.
    """
    direction = options.get("truncation_direction")
    if direction is None:
        direction = "right"
    if not isinstance(direction, str) or direction.lower() not in _DIRECTIONS:
        raise InvalidRequest(f'"truncation_direction" must be "right" or "left", not {direction!r}')
    prompt_name = options.get("prompt_name")
    if prompt_name is not None and not isinstance(prompt_name, str):
        raise InvalidRequest('"prompt_name" must be a string (a prompt name of the model)')
    return SparseRequest(
        texts=texts,
        model=model,
        truncate=_flag(options, "truncate", None),
        truncate_left=direction.lower() == "left",
        prompt_name=prompt_name,
        return_tokens=return_tokens,
    )


def serves_sparse(metadata: Mapping[str, Any]) -> bool:
    """Whether a model's metadata says it returns sparse vectors (``"sparse"`` among its
    ``"embedding"`` outputs)."""
    described = metadata.get(EMBEDDING_KEY)
    outputs = described.get("outputs") if isinstance(described, Mapping) else None
    return isinstance(outputs, list | tuple) and "sparse" in outputs


def sparse_items(request: SparseRequest, metadata: Mapping[str, Any]) -> list[Any]:
    """The items to queue: plain texts when the request sets no option the model must apply
    (it then adds its default prompt), else :class:`EmbedItem` with the prompt resolved.

    :raises InvalidRequest: a prompt name the model does not have.
    """
    described = metadata.get(EMBEDDING_KEY)
    described = described if isinstance(described, Mapping) else {}
    if request.prompt_name is None and not request.truncate_left:
        return list(request.texts)
    prompts = described.get("prompts") or {}
    if request.prompt_name is not None:
        if request.prompt_name not in prompts:
            known = ", ".join(repr(name) for name in prompts) or "none"
            raise InvalidRequest(
                f"unknown prompt_name {request.prompt_name!r}; this model's prompts: {known}"
            )
        prompt = str(prompts[request.prompt_name])
    else:
        prompt = str(described.get("default_prompt") or "")
    return [
        EmbedItem(text, prompt=prompt, truncate_left=request.truncate_left, output="sparse")
        for text in request.texts
    ]


def check_lengths(lengths: list[int], max_length: int) -> None:
    """With ``truncate: false``: refuse the first text over ``max_length`` tokens (prompt and
    special tokens included).

    :raises PayloadTooLarge: naming the text.
    """
    for index, length in enumerate(lengths):
        if length > max_length:
            raise PayloadTooLarge(
                f"inputs[{index}] has more than {max_length} tokens, this model's limit, and "
                '"truncate" is false: send less text or set "truncate": true'
            )


def encode_sparse(vectors: list[SparseVector], return_tokens: bool) -> bytes:
    """TEI's answer: per text, ``[{"index", "value"(, "token")}]`` of its non-zeros."""
    answer: list[list[dict[str, Any]]] = []
    for vector in vectors:
        indices = vector.indices.tolist()
        values = vector.values.tolist()
        if return_tokens:
            tokens = vector.tokens or ()
            if len(tokens) != len(indices):
                raise InvalidRequest(
                    'this model does not name the tokens of its indices: leave out "return_tokens"'
                )
            answer.append(
                [
                    {"index": i, "value": v, "token": t}
                    for i, v, t in zip(indices, values, tokens, strict=True)
                ]
            )
        else:
            answer.append([{"index": i, "value": v} for i, v in zip(indices, values, strict=True)])
    return orjson.dumps(answer)


def max_length_of(metadata: Mapping[str, Any]) -> int | None:
    """The model's max length in tokens, as its ``"embedding"`` metadata says."""
    described = metadata.get(EMBEDDING_KEY)
    length = described.get("max_seq_length") if isinstance(described, Mapping) else None
    return length if isinstance(length, int) and not isinstance(length, bool) else None
