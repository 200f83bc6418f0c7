"""A stand-in text model that takes every item of :mod:`batching.models.items` and declares
them under ``"embedding"``, answering deterministically: its tokenizer is one token per
character (id ``ord(c) + 3``) between ``[CLS]`` (1) and ``[SEP]`` (2), so every expected
answer can be written down by hand.

Each token's vector is ``[id, position, tokens of the text]``; a text's pooled vector is
``[characters, first code point, 1, -1]`` (as :class:`tests.support.models.VectorModel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.models.items import (
    EMBEDDING_KEY,
    DecodeItem,
    EmbedItem,
    TokenizeItem,
    Tokens,
    TokenVectors,
    item_text,
)
from tests.support.models import EchoModel

CLS, SEP, OFFSET = 1, 2, 3
SPECIAL = {0: "[PAD]", CLS: "[CLS]", SEP: "[SEP]"}
VOCAB_SIZE = 0x110000 + OFFSET


def char_ids(text: str) -> list[int]:
    return [ord(char) + OFFSET for char in text]


class CharTokenModel(EchoModel):
    """Per-token vectors, tokenize and decode, one token per character; ``max_seq_length``
    tokens at most per text, special tokens included."""

    max_seq_length = 12
    prompts = {"query": "q: "}

    def _kept(self, text: str, left: bool) -> str:
        room = self.max_seq_length - 2
        if len(text) <= room:
            return text
        return text[len(text) - room :] if left else text[:room]

    def count_tokens(self, item: Any) -> int:
        if isinstance(item, DecodeItem):
            return len(item.ids)
        text = item_text(item)
        assert text is not None, f"cannot count {item!r}"
        return min(len(text) + 2, self.max_seq_length)

    def token_length(self, item: Any, limit: int) -> int:
        text = item_text(item)
        assert text is not None, f"cannot count {item!r}"
        return min(len(text) + 2, limit)

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.batches.append(list(inputs))
        return [self._answer(item) for item in inputs]

    def _answer(self, item: Any) -> Any:
        if isinstance(item, TokenizeItem):
            text = item.prompt + item.text
            ids = char_ids(text)
            offsets = [(index, index + 1) for index in range(len(text))]
            tokens, special = list(text), [False] * len(text)
            if item.add_special_tokens:
                ids = [CLS, *ids, SEP]
                tokens = ["[CLS]", *tokens, "[SEP]"]
                special = [True, *special, True]
                offsets = [(0, 0), *offsets, (0, 0)]
            return Tokens(tuple(ids), tuple(tokens), tuple(special), tuple(offsets))
        if isinstance(item, DecodeItem):
            return "".join(
                ("" if item.skip_special_tokens else SPECIAL[i]) if i < OFFSET else chr(i - OFFSET)
                for i in item.ids
            )
        if isinstance(item, EmbedItem) and item.output == "tokens":
            kept = self._kept(item.prompt + item.text, item.truncate_left)
            run = np.array([CLS, *char_ids(kept), SEP], dtype=np.int64)
            vectors = np.stack(
                [run, np.arange(len(run)), np.full(len(run), len(run))], axis=1
            ).astype(np.float32)
            return TokenVectors(ids=run, vectors=vectors)
        text = item if isinstance(item, str) else item.prompt + item.text
        return np.array([len(text), ord(text[0]) if text else 0, 1.0, -1.0], dtype=np.float32)

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 4]}],
            EMBEDDING_KEY: {
                "prompts": dict(self.prompts),
                "default_prompt_name": None,
                "default_prompt": "",
                "max_seq_length": self.max_seq_length,
                "normalized": False,
                "outputs": ["dense", "tokens"],
                "encodings": ["float"],
                "truncation_directions": ["right", "left"],
                "tokenize": True,
                "vocab_size": VOCAB_SIZE,
                "token_dimension": 3,
            },
        }


class LongCharTokenModel(CharTokenModel):
    """The same, taking texts of up to 2048 tokens."""

    max_seq_length = 2048
