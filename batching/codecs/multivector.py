"""Per-token vectors: the ``POST /embed_all`` body in and out (TEI's keys), the plan of a
per-token request whatever its door (the data plane runs it: :mod:`batching.plane.embedding`).

``/embed_all`` takes ``{"inputs": text | [text, ...], "truncate": true,
"truncation_direction": "right", "prompt_name": null, "model": null}`` (``input_type`` too,
as every embedding door takes it) and answers ``{"model", "embeddings": [[[float, ...], ...],
...], "ids": [[int, ...], ...], "usage": {"prompt_tokens", "total_tokens"}}``: per text one
vector per token the model ran (special tokens included) and the ids of those tokens.

The options are the shared embedding options (:mod:`.embed_options`), read and checked the
same way on every door: ``truncate: false`` refuses a text longer than the model's limit with
a 413 naming the limit and the text's token count; ``truncation_direction`` picks the side that
is cut (TEI's ``Right``/``Left`` are taken too). ``dimensions`` and compact ``encoding``\\ s
apply to pooled vectors only: asked of per-token vectors they are a 400.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from batching.errors import InferenceFailed
from batching.models.items import EmbedItem, TokenVectors

from .embed_options import (
    OPTION_NAMES,
    EmbedOptions,
    EmbedPlan,
    embedding_info,
    plan_embedding,
    read_options,
    refuse_dense_only,
)
from .tokens import json_object, optional_str, texts_of, usage_of

__all__ = [
    "EMBED_ALL_KEYS",
    "EmbedAllRequest",
    "TokenAnswer",
    "encode_embed_all",
    "parse_embed_all_request",
    "token_options",
    "token_plan",
    "token_vectors",
]

#: The body's keys: TEI's, ``model``, and every embedding option (so that one asked of pooled
#: vectors only is refused by name, not as an unknown key).
EMBED_ALL_KEYS = ("inputs", "model", *OPTION_NAMES)


def token_options(
    values: Mapping[str, object], *, where: str, ignore: Sequence[str] = ()
) -> EmbedOptions:
    """The embedding options among ``values`` (a body's keys, a request's parameters), with
    TEI's capitalised ``truncation_direction`` taken as it means.

    :raises InvalidRequest: an unknown option, or a value of the wrong type.
    """
    direction = values.get("truncation_direction")
    if isinstance(direction, str) and direction.lower() in ("left", "right"):
        values = {**values, "truncation_direction": direction.lower()}
    return read_options(values, where=where, ignore=ignore)


def token_plan(
    texts: Sequence[str],
    options: EmbedOptions,
    metadata: Mapping[str, object],
    *,
    model: str,
    truncate_default: bool = True,
) -> EmbedPlan:
    """The per-token items of ``texts`` (``EmbedItem(output="tokens")``, the prompt resolved),
    checked as every embedding request is (:func:`.embed_options.plan_embedding`).

    :raises OptionError: an option the model cannot apply, or one of pooled vectors only.
    """
    refuse_dense_only(
        options,
        dimensions="dimensions shortens pooled embeddings; per-token vectors keep their width",
        encoding=f"per-token vectors are float; encoding {options.wire_encoding!r} applies to "
        "pooled embeddings",
    )
    plan = plan_embedding(texts, options, metadata, model=model, truncate_default=truncate_default)
    info = embedding_info(metadata) or {}
    default_prompt = str(info.get("default_prompt") or "")
    items: list[str | EmbedItem] = [
        EmbedItem(item, prompt=default_prompt, output="tokens")
        if isinstance(item, str)
        else dataclasses.replace(item, output="tokens")
        for item in plan.items
    ]
    return dataclasses.replace(plan, items=items)


@dataclass(frozen=True, slots=True)
class TokenAnswer:
    """What a per-token request got: per text its token vectors and ids, in order."""

    outputs: list[TokenVectors]
    #: Per text, whether the model cut it at its maximum length; None when not known.
    truncated: list[bool] | None
    #: Tokens the model ran, prompts and special tokens included.
    tokens: int


@dataclass(frozen=True, slots=True)
class EmbedAllRequest:
    model: str | None
    texts: list[str]
    options: EmbedOptions


def parse_embed_all_request(body: bytes) -> EmbedAllRequest:
    """:raises InvalidRequest: not a JSON object, an unknown key, a value of the wrong type."""
    document = json_object(body, EMBED_ALL_KEYS, "/embed_all")
    return EmbedAllRequest(
        model=optional_str(document, "model"),
        texts=texts_of(document),
        options=token_options(document, where="the body", ignore=("inputs", "model")),
    )


def token_vectors(outputs: Sequence[object]) -> list[TokenVectors]:
    """The model's outputs, checked to be per-token vectors with one id per vector.

    :raises InferenceFailed: the model broke the contract.
    """
    checked = []
    for output in outputs:
        if not isinstance(output, TokenVectors):
            raise InferenceFailed(
                f"the model answered a per-token item with {type(output).__name__}"
            )
        vectors = np.asarray(output.vectors, dtype=np.float32)
        ids = np.asarray(output.ids, dtype=np.int64).reshape(-1)
        if vectors.ndim != 2 or vectors.shape[0] != ids.shape[0]:
            raise InferenceFailed(
                f"the model answered {ids.shape[0]} token ids with vectors of shape "
                f"{list(vectors.shape)}"
            )
        checked.append(TokenVectors(ids=ids, vectors=vectors))
    return checked


def encode_embed_all(model: str, answer: TokenAnswer) -> bytes:
    """The ``/embed_all`` answer: per text its token vectors and ids, and the usage."""
    return orjson.dumps(
        {
            "model": model,
            "embeddings": [output.vectors for output in answer.outputs],
            "ids": [output.ids for output in answer.outputs],
            "usage": usage_of([len(output.ids) for output in answer.outputs]),
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
