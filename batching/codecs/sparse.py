"""The ``POST /embed_sparse`` body, as text-embeddings-inference (TEI) takes and answers it.

Request: ``{"inputs": str | [str], "model"?: name, "return_tokens"?: bool}`` and the
embedding options every door reads with the shared parser
(:mod:`batching.codecs.embed_options`) that apply to a sparse vector: ``prompt_name`` (or
``input_type``), ``truncate``, ``truncation_direction``. Any other key is a 400, as is an
option of the wrong type, ``dimensions`` or a non-float ``encoding``, or a prompt name the
model does not have: an option the server would not apply is never silently ignored.

Answer: per text, the non-zero entries of its sparse vector, ``[{"index": i, "value": v}]``
with ``"token"`` (the vocabulary entry) when ``return_tokens`` is true; indices ascending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson

from batching.errors import InferenceFailed, InvalidRequest
from batching.models.items import EMBEDDING_KEY, EmbedItem, Item, SparseVector
from batching.runtime.deployment import Deployment

from .capability import max_seq_length
from .embed_options import (
    OptionError,
    TextTooLong,
    read_options,
    refuse_dense_only,
    resolve_prompt,
)
from .plain import check_texts

__all__ = [
    "KEYS",
    "OPTIONS",
    "SparseRequest",
    "check_lengths",
    "encode_sparse",
    "options_request",
    "parse_sparse_request",
    "refused_length",
    "serves_sparse",
    "sparse_items",
]

#: The options that change how a sparse vector is computed (also v2 request parameters).
OPTIONS = ("prompt_name", "input_type", "truncate", "truncation_direction")
#: The body's own fields, beside the options.
_FIELDS = ("inputs", "model", "return_tokens")
#: Every key the body may hold.
KEYS = (*_FIELDS, *OPTIONS)


@dataclass(frozen=True, slots=True)
class SparseRequest:
    """A parsed ``/embed_sparse`` body.

    :param truncate: cut texts over the model's max length; False: such a text is a 413;
        None: the server's default (``--no-truncate`` makes it False).
    """

    texts: Sequence[str]
    model: str | None = None
    truncate: bool | None = None
    truncate_left: bool = False
    prompt_name: str | None = None
    input_type: str | None = None
    return_tokens: bool = False


def _flag(document: Mapping[str, object], key: str) -> bool:
    value = document.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise OptionError(f"{key} must be true or false, not {value!r}", param=key)
    return value


def parse_sparse_request(body: bytes) -> SparseRequest:
    """Parse and check a body (the prompt name is checked against the model later).

    :raises InvalidRequest: not a JSON object, unknown keys, missing or empty ``inputs``,
        options of the wrong type or value, an option sparse vectors have no use for.
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
        where="the request",
        ignore=_FIELDS,
        model=model,
        return_tokens=_flag(document, "return_tokens"),
    )


def options_request(
    texts: Sequence[str],
    options: Mapping[str, object],
    *,
    where: str,
    ignore: Iterable[str] = (),
    model: str | None = None,
    return_tokens: bool = False,
) -> SparseRequest:
    """``texts`` with the embedding options of ``options``, read by the shared option parser
    (:func:`~batching.codecs.embed_options.read_options`): the body of ``/embed_sparse``, or
    a v2 request's parameters.

    :param ignore: keys of ``options`` that are not options (the door's own fields).
    :raises InvalidRequest: an unknown option, a wrong value, or ``dimensions`` or an
        ``encoding`` other than float (a sparse vector has neither).
    """
    read = read_options(options, where=where, ignore=ignore)
    refuse_dense_only(
        read,
        dimensions="dimensions does not apply to sparse vectors: they keep their non-zero entries",
        encoding="encoding does not apply to sparse vectors: their values are float",
    )
    return SparseRequest(
        texts=texts,
        model=model,
        truncate=read.truncate,
        truncate_left=read.truncation_direction == "left",
        prompt_name=read.prompt_name,
        input_type=read.input_type,
        return_tokens=return_tokens,
    )


def serves_sparse(metadata: Mapping[str, object]) -> bool:
    """Whether a model's metadata says it returns sparse vectors (``"sparse"`` among its
    ``"embedding"`` outputs)."""
    described = metadata.get(EMBEDDING_KEY)
    outputs = described.get("outputs") if isinstance(described, Mapping) else None
    return isinstance(outputs, list | tuple) and "sparse" in outputs


def sparse_items(request: SparseRequest, metadata: Mapping[str, object]) -> list[Item]:
    """The items to queue: plain texts when the request sets no option the model must apply
    (it then adds its default prompt), else :class:`EmbedItem` with the prompt resolved.

    :raises InvalidRequest: a prompt name (or input type) the model has no prompt for.
    """
    described = metadata.get(EMBEDDING_KEY)
    info: Mapping[str, object] = described if isinstance(described, Mapping) else {}
    # The prompt prompt_name or input_type picks, as for dense embeddings.
    prompt = resolve_prompt(request.prompt_name, request.input_type, info, request.model)
    if prompt is None and not request.truncate_left:
        return list(request.texts)
    if prompt is None:
        prompt = str(info.get("default_prompt") or "")
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
            raise TextTooLong(
                f"inputs[{index}] has more than {max_length} tokens, this model's limit, and "
                '"truncate" is false: send less text or set "truncate": true'
            )


def encode_sparse(outputs: Sequence[object], return_tokens: bool) -> bytes:
    """TEI's answer: per text, ``[{"index", "value"(, "token")}]`` of its non-zeros.

    :raises InferenceFailed: the model answered with something else than sparse vectors.
    """
    answer: list[list[dict[str, object]]] = []
    for vector in outputs:
        if not isinstance(vector, SparseVector):
            raise InferenceFailed(f"the model answered a sparse item with {type(vector).__name__}")
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


def refused_length(
    deployment: Deployment, truncate: object, metadata: Mapping[str, object] | None = None
) -> int | None:
    """The most tokens a sparse model's item may have when it may not be cut: its max length
    with ``truncate: false`` (asked, or the server's ``--no-truncate`` when not asked); None
    when items are cut (or the model is not sparse, or states no length). ``truncate`` is as
    sent: only ``False`` refuses."""
    metadata = deployment.metadata if metadata is None else metadata
    if not serves_sparse(metadata):
        return None
    if (deployment.config.truncate if truncate is None else truncate) is not False:
        return None
    return max_seq_length(metadata)
