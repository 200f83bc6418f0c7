"""A small embedding model that declares ``"embedding"`` metadata and applies
:class:`~batching.models.items.EmbedItem` options deterministically, recording every item it
got: the doors' options are tested against it without torch.

Its tokenizer is words: a text costs one token per word of prompt + text, plus 2 (as [CLS]
and [SEP]); texts over :data:`MAX_SEQ` tokens are cut at the right (or the left). A vector is
a function of the words kept, so a cut and a prompt both show in it. Compact encodings use
sentence-transformers' ``quantize_embeddings`` with the ranges its metadata shows.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import numpy as np
from sentence_transformers.util.quantization import quantize_embeddings

from batching.models.items import EmbedItem

DIM = 16
MAX_SEQ = 8
PROMPTS = {"query": "query: ", "passage": "passage: ", "document": "doc: "}
DEFAULT_PROMPT_NAME = "query"
#: The per-dimension int8/uint8 ranges it "calibrated".
RANGES = np.stack([np.full(DIM, -0.5, np.float32), np.full(DIM, 0.5, np.float32)])


def words_of(prompt: str, text: str, truncate_left: bool = False) -> list[str]:
    """The words the model runs: prompt + text, cut to ``MAX_SEQ - 2`` words."""
    words = (prompt + text).split()
    room = MAX_SEQ - 2
    if len(words) <= room:
        return words
    return words[-room:] if truncate_left else words[:room]


def vector_of(words: list[str], dimensions: int | None = None) -> np.ndarray:
    """A unit vector that depends on every word kept (and their order)."""
    digest = hashlib.sha256(" ".join(words).encode()).digest()
    raw = np.frombuffer(digest[: DIM * 2], dtype=np.uint8)[:DIM].astype(np.float32) - 127.5
    if dimensions is not None:
        raw = raw[:dimensions]
    return (raw / np.linalg.norm(raw)).astype(np.float32)


class OptionEmbedder:
    """Answers strings (default prompt, right cut, float) and EmbedItems (their options)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._lock = threading.Lock()

    def load(self, device: str) -> None:
        pass

    def _tokens(self, item: Any) -> int:
        if isinstance(item, EmbedItem):
            return len((item.prompt + item.text).split()) + 2
        return len((PROMPTS[DEFAULT_PROMPT_NAME] + str(item)).split()) + 2

    def count_tokens(self, item: Any) -> int:
        return min(self._tokens(item), MAX_SEQ)

    def token_length(self, item: Any, limit: int) -> int:
        return min(self._tokens(item), limit)

    def predict(self, inputs: list[Any]) -> list[np.ndarray]:
        with self._lock:
            self.items.extend(inputs)
        outputs = []
        for item in inputs:
            if isinstance(item, EmbedItem):
                words = words_of(item.prompt, item.text, item.truncate_left)
                vector = vector_of(words, item.dimensions)
                if item.encoding != "float":
                    ranges = RANGES[:, : vector.shape[0]]
                    vector = quantize_embeddings(vector[None], item.encoding, ranges=ranges)[0]
            else:
                vector = vector_of(words_of(PROMPTS[DEFAULT_PROMPT_NAME], item))
            outputs.append(vector)
        return outputs

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [
                {"name": "embedding", "datatype": "FP32", "shape": [-1, DIM], "normalized": True}
            ],
            "embedding": {
                "prompts": dict(PROMPTS),
                "default_prompt_name": DEFAULT_PROMPT_NAME,
                "default_prompt": PROMPTS[DEFAULT_PROMPT_NAME],
                "max_seq_length": MAX_SEQ,
                "normalized": True,
                "outputs": ["dense"],
                "encodings": ["float", "int8", "uint8", "binary", "ubinary"],
                "quantization_ranges": RANGES.tolist(),
                "calibration_texts": 4,
                "truncation_directions": ["right", "left"],
                "tokenize": False,
            },
        }
