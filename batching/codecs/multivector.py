"""Per-token vectors: the ``POST /embed_all`` body in and out, in TEI's keys, and the options
every door shares for them (the v2 door takes the same ones as request parameters).

``/embed_all`` takes ``{"inputs": text | [text, ...], "truncate": true,
"truncation_direction": "right", "prompt_name": null, "model": null}`` and answers
``{"model", "embeddings": [[[float, ...], ...], ...], "ids": [[int, ...], ...],
"usage": {"prompt_tokens", "total_tokens"}}``: per text one vector per token the model ran
(special tokens included) and the ids of those tokens.

``truncate: false`` refuses a text longer than the model's limit with a 413 naming the limit and
the text's token count, instead of cutting it. ``truncation_direction`` (``right`` or ``left``,
in any case, as TEI spells them ``Right``/``Left``) picks the side that is cut. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from batching.errors import InferenceFailed, InvalidRequest, PayloadTooLarge
from batching.models.items import EmbedItem, TokenVectors

from .capability import max_seq_length, resolve_prompt, truncation_directions
from .tokens import json_object, optional_bool, optional_str, texts_of, usage_of

__all__ = [
    "EMBED_ALL_KEYS",
    "TokenOptions",
    "check_lengths",
    "encode_embed_all",
    "length_limit",
    "parse_embed_all_request",
    "token_options",
    "token_vectors",
]

EMBED_ALL_KEYS = ("inputs", "truncate", "truncation_direction", "prompt_name", "model")

#: The options of per-token vectors, whatever the door: JSON keys or v2 parameters.
OPTION_KEYS = ("truncate", "truncation_direction", "prompt_name")


@dataclass(frozen=True, slots=True)
class TokenOptions:
    """How per-token vectors are asked for: the prompt by name (None: the model's default),
    whether an over-long text is cut (else refused) and on which side."""

    prompt_name: str | None = None
    truncate: bool = True
    truncate_left: bool = False

    def items(self, texts: Sequence[str], metadata: Mapping[str, Any], model: str) -> list[Any]:
        """The queue's ``EmbedItem(output="tokens")`` items, the prompt resolved.

        :raises InvalidRequest: an unknown prompt name, or a side the model cannot cut.
        """
        if self.truncate_left and "left" not in truncation_directions(metadata):
            raise InvalidRequest(f"model {model!r} cannot truncate texts on the left")
        prompt = resolve_prompt(metadata, self.prompt_name, model)
        return [
            EmbedItem(text, prompt=prompt, truncate_left=self.truncate_left, output="tokens")
            for text in texts
        ]


def token_options(values: Mapping[str, Any]) -> TokenOptions:
    """The options among ``values`` (a JSON body or a request's parameters); others are the
    caller's to refuse or use.

    :raises InvalidRequest: a value of the wrong type, or an unknown truncation side.
    """
    direction = optional_str(values, "truncation_direction")
    side = "right" if direction is None else direction.lower()
    if side not in ("right", "left"):
        raise InvalidRequest(f"'truncation_direction' must be 'right' or 'left', not {direction!r}")
    return TokenOptions(
        prompt_name=optional_str(values, "prompt_name"),
        truncate=optional_bool(values, "truncate", True),
        truncate_left=side == "left",
    )


@dataclass(frozen=True, slots=True)
class EmbedAllRequest:
    model: str | None
    texts: list[str]
    options: TokenOptions


def parse_embed_all_request(body: bytes) -> EmbedAllRequest:
    """:raises InvalidRequest: see the module's rules."""
    document = json_object(body, EMBED_ALL_KEYS, "/embed_all")
    return EmbedAllRequest(
        model=optional_str(document, "model"),
        texts=texts_of(document),
        options=token_options(document),
    )


#: An over-long text's tokens are counted up to this many times the model's limit, so that
#: the 413 says how long it is without tokenizing a huge text in full.
COUNT_BEYOND = 4


def length_limit(options: TokenOptions, metadata: Mapping[str, Any], model: str) -> int | None:
    """How far to count each text's tokens before truncation when truncation is off
    (:data:`COUNT_BEYOND` times the model's limit, plus one); None when it is on (no need to).

    :raises InvalidRequest: truncation is off and the model does not say its limit.
    """
    if options.truncate:
        return None
    limit = max_seq_length(metadata)
    if limit is None:
        raise InvalidRequest(
            f"model {model!r} does not say how many tokens it takes, so 'truncate': false "
            "cannot be checked"
        )
    return limit * COUNT_BEYOND + 1


def check_lengths(
    lengths: Sequence[int] | None,
    options: TokenOptions,
    metadata: Mapping[str, Any],
    model: str,
) -> None:
    """``truncate: false``: every text within the model's limit.

    :param lengths: each text's tokens before truncation (prompt and special tokens
        included), counted as far as :func:`length_limit` says; None when the model cannot
        count them.
    :raises PayloadTooLarge: naming the first text over the limit, its count and the limit.
    :raises InvalidRequest: truncation is off and the model cannot count tokens.
    """
    if options.truncate:
        return
    limit = max_seq_length(metadata)
    if lengths is None or limit is None:
        raise InvalidRequest(
            f"model {model!r} cannot count tokens, so 'truncate': false cannot be checked"
        )
    counted_to = limit * COUNT_BEYOND + 1
    for index, length in enumerate(lengths):
        if length > limit:
            count = f"{length}" if length < counted_to else f"more than {counted_to - 1}"
            raise PayloadTooLarge(
                f"inputs[{index}] has {count} tokens (prompt and special tokens included) and "
                f"truncation is off; model {model!r} takes at most {limit} tokens per text "
                "(truncate: true cuts the text instead)"
            )


def token_vectors(outputs: Sequence[Any]) -> list[TokenVectors]:
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


def encode_embed_all(model: str, outputs: Sequence[Any]) -> bytes:
    """The ``/embed_all`` answer of the model's :class:`TokenVectors`, one per text."""
    vectors = token_vectors(outputs)
    return orjson.dumps(
        {
            "model": model,
            "embeddings": [output.vectors for output in vectors],
            "ids": [output.ids for output in vectors],
            "usage": usage_of([len(output.ids) for output in vectors]),
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
