"""A text model's tokenizer, as requests use it beyond the plain embedding path: ``/tokenize``
(:class:`TokenizeItem` -> :class:`Tokens`), ``/decode`` (:class:`DecodeItem` -> ``str``),
the length of a prompt, and truncation at the start of a text (``truncation_direction:
left``) that keeps the prompt and the special tokens.

Works on any transformers tokenizer object; imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import NDArray

from batching.errors import UnprocessableInput

from ..items import DecodeItem, TokenizeItem, Tokens

if TYPE_CHECKING:  # annotations only: this module imports no transformers
    from transformers import PreTrainedTokenizerBase

    from .tokenizer_json import JsonTokenizer

    #: What tokenises a text model's items: transformers' tokenizer, or the folder's
    #: ``tokenizer.json`` read without transformers (:mod:`.tokenizer_json`).
    TextTokenizer: TypeAlias = PreTrainedTokenizerBase | JsonTokenizer

#: A padded batch as numpy arrays by name (``input_ids``, ``attention_mask``, ...).
Batch: TypeAlias = Mapping[str, NDArray[np.int64]]

__all__ = ["Batch", "decode", "encode_batch", "encode_left", "prompt_length", "tokenize"]


def tokenize(tokenizer: TextTokenizer, item: TokenizeItem, lowercase: bool = False) -> Tokens:
    """``item``'s prompt + text as tokens, untruncated, as TEI's ``/tokenize`` gives them:
    per token its id, its text (the characters it covers; a special token's own spelling),
    whether it is special, and its ``[start, stop)`` character offsets in prompt + text
    (``(0, 0)`` for a special token the tokenizer added)."""
    full = item.prompt + item.text
    encoded = tokenizer(
        full.lower() if lowercase else full,
        add_special_tokens=item.add_special_tokens,
        truncation=False,
        return_offsets_mapping=True,
        verbose=False,
    )
    ids: list[int] = list(encoded["input_ids"])
    offsets = [(int(start), int(stop)) for start, stop in encoded["offset_mapping"]]
    special_ids = set(tokenizer.all_special_ids)
    special = tuple(token in special_ids for token in ids)
    spelled = tokenizer.convert_ids_to_tokens(ids)
    texts = tuple(
        spelled[i] if special[i] else full[start:stop] for i, (start, stop) in enumerate(offsets)
    )
    return Tokens(tuple(ids), texts, special, tuple(offsets))


def decode(tokenizer: TextTokenizer, item: DecodeItem) -> str:
    """``item``'s ids as text.

    :raises UnprocessableInput: for an id outside the vocabulary.
    """
    size = len(tokenizer)
    bad = [token for token in item.ids if not 0 <= token < size]
    if bad:
        raise UnprocessableInput(f"token id {bad[0]} is outside the vocabulary (0 to {size - 1})")
    text = tokenizer.decode(list(item.ids), skip_special_tokens=item.skip_special_tokens)
    if not isinstance(text, str):  # transformers' answer to a batch of id lists
        raise TypeError(f"decoding one list of ids gave {type(text).__name__}, not a text")
    return text


def prompt_length(tokenizer: TextTokenizer, prompt: str) -> int:
    """The tokens ``prompt`` takes at the start of a tokenised prompt + text, leading special
    tokens included: sentence-transformers' ``_get_prompt_length`` (the prompt tokenised
    alone, less a trailing special token)."""
    if not prompt:
        return 0
    ids = tokenizer(prompt, verbose=False)["input_ids"]
    if ids and ids[-1] in set(tokenizer.all_special_ids):
        return len(ids) - 1
    return len(ids)


def encode_left(
    tokenizer: TextTokenizer, texts: Sequence[str], prompts: Sequence[int], max_length: int
) -> list[dict[str, list[int]]]:
    """``texts`` tokenised (unpadded) and cut at their start to ``max_length`` tokens, keeping
    the leading special tokens, each text's first ``prompts[i]`` tokens (its prompt, as
    :func:`prompt_length` counts it) and the trailing special tokens: so a long document keeps
    its end and its instruction. Where the prompt and special tokens alone fill the window,
    the text is cut at its end instead."""
    special_ids = set(tokenizer.all_special_ids)
    rows: list[dict[str, list[int]]] = []
    for text, prompt in zip(texts, prompts, strict=True):
        encoded = tokenizer(text, truncation=False, verbose=False)
        row = {key: list(value) for key, value in encoded.items()}
        ids = row["input_ids"]
        total = len(ids)
        if total <= max_length:
            rows.append(row)
            continue
        lead = next((i for i, token in enumerate(ids) if token not in special_ids), total)
        trail = next(
            (i for i, token in enumerate(reversed(ids)) if token not in special_ids), total
        )
        lead = max(lead, prompt)
        keep = max_length - lead - trail
        if keep <= 0:
            cut = tokenizer(text, truncation=True, max_length=max_length, verbose=False)
            rows.append({key: list(value) for key, value in cut.items()})
            continue
        rows.append(
            {
                key: value[:lead]
                + value[total - trail - keep : total - trail]
                + value[total - trail :]
                for key, value in row.items()
            }
        )
    return rows


def encode_batch(
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    left: Sequence[bool],
    prompts: Sequence[int] | NDArray[np.int64] | None,
    max_length: int,
) -> Batch:
    """``texts`` as one padded numpy batch, each cut to ``max_length`` tokens at the end it
    asks for: at its start where ``left[i]`` (keeping its prompt, ``prompts[i]`` tokens, and
    the special tokens: :func:`encode_left`), else at its end."""
    if not any(left):
        return tokenizer(
            list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="np"
        )
    assert prompts is not None
    rows: list[dict[str, list[int]]] = [{} for _ in texts]
    lefts = [i for i, cut_left in enumerate(left) if cut_left]
    rights = [i for i, cut_left in enumerate(left) if not cut_left]
    cut = encode_left(
        tokenizer, [texts[i] for i in lefts], [int(prompts[i]) for i in lefts], max_length
    )
    for i, row in zip(lefts, cut, strict=True):
        rows[i] = row
    if rights:
        encoded = tokenizer(
            [texts[i] for i in rights], truncation=True, max_length=max_length, verbose=False
        )
        for n, i in enumerate(rights):
            rows[i] = {key: list(values[n]) for key, values in encoded.items()}
    return tokenizer.pad(rows, padding=True, return_tensors="np")
