"""What the transformers-backed models share: devices, pooling, token counting, and the one
tokenise-and-run step. This package's modules are the only ones that import torch."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

__all__ = [
    "WEIGHTS_LOADING",
    "TokenCounter",
    "calibration_texts",
    "encode",
    "encode_and_run",
    "max_length_of",
    "mean_pool",
    "read_json",
    "require_strings",
    "resolve_device",
    "to_numpy",
    "warmup_text",
]

#: Held while transformers builds a model from its weights: ``from_pretrained`` is not
#: thread-safe (while it builds a model it swaps how every ``nn.Module`` registers its
#: parameters, to the meta device), so instances loading at once on their own threads would
#: get each other's meta tensors ("Cannot copy out of meta tensor").
WEIGHTS_LOADING = threading.Lock()

# A tokenizer without a configured limit reports a huge sentinel as model_max_length.
_NO_LIMIT = 1_000_000

_WARMUP_WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "batching",
)

_CALIBRATION_WORDS = (
    *("a", "cat", "sat", "on", "the", "mat", "and", "it", "was", "very", "good", "not"),
    *("bad", "movie", "house", "tree", "runs", "fast", "slow", "what", "where", "who"),
    *("eats", "fish", "sleeps", "red", "blue", "green", "i", "like", "with", "dog"),
)

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def resolve_device(device: str) -> torch.device:
    """Check a device string ("cpu", "cuda", "cuda:N") and turn it into a ``torch.device``.

    :raises ValueError: for any other spelling, or "cpu:N".
    :raises RuntimeError: when CUDA is asked for but absent, or the index is out of range.
    """
    match = _DEVICE_RE.match(device.strip())
    if match is None:
        raise ValueError(f"device {device!r} is not one of 'cpu', 'cuda', 'cuda:N'")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise ValueError(f"device {device!r}: write 'cpu' without an index")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device!r} asked for, but torch reports no usable CUDA device "
            f"(torch {torch.__version__}); use --device cpu"
        )
    ordinal = int(index) if index is not None else 0
    count = torch.cuda.device_count()
    if ordinal >= count:
        raise RuntimeError(f"device {device!r} asked for, but only {count} CUDA device(s) exist")
    return torch.device("cuda", ordinal)


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


def max_length_of(tokenizer: Any, config: dict[str, Any]) -> int:
    """The longest input the model accepts: the smaller of the tokenizer's and the position
    table's limits (sentence-transformers' rule when its config names no length)."""
    limits = [
        limit
        for limit in (
            getattr(tokenizer, "model_max_length", None),
            config.get("max_position_embeddings"),
        )
        if isinstance(limit, int) and 0 < limit < _NO_LIMIT
    ]
    return min(limits, default=512)


def to_numpy(array: torch.Tensor) -> np.ndarray:
    # .numpy() shares memory with a CPU float32 tensor, so the common case copies nothing.
    if array.device.type != "cpu" or array.dtype != torch.float32:
        array = array.to(device="cpu", dtype=torch.float32)
    return array.numpy()


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor, sqrt_len: bool = False) -> torch.Tensor:
    """Average the token vectors over real tokens only, so padding never shifts the result."""
    weights = mask.to(hidden.dtype)
    # A batched matmul sums the masked rows without materialising hidden * mask.
    summed = torch.bmm(weights.unsqueeze(1), hidden).squeeze(1)
    counts = weights.sum(dim=1, keepdim=True).clamp(min=1e-9)
    return summed / (counts.sqrt() if sqrt_len else counts)


class TokenCounter:
    """A private fast tokenizer for :meth:`count_tokens`, separate from the one ``predict`` uses.

    The event loop may count while the instance thread encodes a batch; the Rust tokenizer
    refuses concurrent use when one caller changes its padding/truncation settings ("Already
    borrowed"), so the counter gets its own copies, configured once and never mutated after:
    one truncating at the model's max length (what a batch costs), one not truncating at all
    (how long an input really is, for request limits).
    """

    # Inputs longer than this many characters per allowed token are first counted on a
    # prefix: encoding a megabyte of text to learn it exceeds 256 tokens would cost ms.
    _CHARS_PER_TOKEN_BOUND = 8

    def __init__(self, path: Path, max_length: int | None) -> None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        config_path = path / "config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        self.max_length = max_length if max_length is not None else max_length_of(tokenizer, config)
        self.mask_token: str | None = getattr(tokenizer, "mask_token", None)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend: Any = None
        self._full_backend: Any = None
        self._tokenizer: Any = tokenizer
        if backend is not None:
            # A copy made before the settings change, so the two never share state.
            full = type(backend).from_str(backend.to_str())
            full.no_padding()
            full.no_truncation()
            self._full_backend = full
            # Truncation in the backend caps the count; padding would inflate it.
            backend.no_padding()
            backend.enable_truncation(self.max_length)
            self._backend = backend

    @property
    def tokenizer(self) -> Any:
        """The counter's own tokenizer (its chat template, for counting a chat's prompt)."""
        return self._tokenizer

    def count(self, text: str, pair: str | None = None) -> int:
        """Tokens of ``text`` (and ``pair``, as one sequence pair), special tokens included,
        after truncation at the max length: what the input costs in a batch."""
        if pair is not None:
            return self._encode_length(text, pair, truncate=True)
        limit = self.max_length
        if self._prefix_reaches(text, limit, truncate=True):
            return limit
        return self._encode_length(text, None, truncate=True)

    def length(self, text: str, limit: int, pair: str | None = None) -> int:
        """Tokens of ``text`` (and ``pair``) before any truncation, special tokens included,
        counted no further than ``limit``: a result of ``limit`` means "at least ``limit``"."""
        if limit <= self.max_length:
            return min(self.count(text, pair), limit)
        if pair is None and self._prefix_reaches(text, limit, truncate=False):
            return limit
        return min(self._encode_length(text, pair, truncate=False), limit)

    def _prefix_reaches(self, text: str, limit: int, *, truncate: bool) -> bool:
        """Whether a prefix of a long ``text`` already has ``limit`` tokens.

        Cutting at a space keeps every word of the prefix whole, so (for tokenizers that split
        on whitespace first, as WordPiece, BPE and SentencePiece do) the prefix never has more
        tokens than the full text: if it reaches the limit, so does the text."""
        cut = limit * self._CHARS_PER_TOKEN_BOUND
        if len(text) <= cut:
            return False
        space = text.rfind(" ", 0, cut)
        return space > 0 and self._encode_length(text[:space], None, truncate=truncate) >= limit

    def _encode_length(self, text: str, pair: str | None, *, truncate: bool) -> int:
        backend = self._backend if truncate else self._full_backend
        if backend is not None:
            return len(backend.encode(text, pair))
        if truncate:
            encoded = self._tokenizer(
                text, pair, truncation=True, max_length=self.max_length, verbose=False
            )
        else:
            encoded = self._tokenizer(text, pair, truncation=False, verbose=False)
        return len(encoded["input_ids"])


def encode(
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int,
    device: torch.device,
    pairs: Sequence[str] | None = None,
) -> Any:
    """Tokenise ``texts`` (with ``pairs``, as sequence pairs), padded to the longest and
    truncated at ``max_length``, as tensors on ``device``."""
    encoded = tokenizer(
        list(texts),
        None if pairs is None else list(pairs),
        padding=True,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return encoded.to(device) if device.type != "cpu" else encoded


def encode_and_run(
    tokenizer: Any,
    run: Callable[[Any], torch.Tensor],
    texts: Sequence[str],
    max_length: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise ``texts`` (padded to the longest, truncated at ``max_length``), run them
    through ``run`` (the model's engine: its first output from the encoded batch) on
    ``device``, and return the last hidden state with the attention mask. Call it under
    ``torch.inference_mode()``."""
    encoded = encode(tokenizer, texts, max_length, device)
    hidden = run(encoded)
    return hidden, encoded["attention_mask"]


def calibration_texts(words: int, prefix: str = "") -> list[str]:
    """Texts of spread lengths (1 word up to ``words``), for the engines' accuracy check:
    padding, short and full-length inputs all take part."""
    lengths = sorted({max(1, round(words * share)) for share in (0, 0.05, 0.15, 0.3, 0.5, 1)})
    vocabulary = _CALIBRATION_WORDS
    return [
        prefix + " ".join(vocabulary[(i * 7 + n * 3) % len(vocabulary)] for i in range(length))
        for n, length in enumerate(lengths)
    ]


def warmup_text(words: int) -> str:
    """A text of ``words`` words: at least one token each, so it reaches ``words`` tokens."""
    return " ".join(_WARMUP_WORDS[i % len(_WARMUP_WORDS)] for i in range(words))


def require_strings(inputs: Sequence[Any]) -> None:
    for index, item in enumerate(inputs):
        if not isinstance(item, str):
            raise TypeError(f"input {index} is {type(item).__name__}, expected a string")
