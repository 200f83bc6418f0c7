"""What the text models share without torch: reading a folder's JSON, the longest input a model
takes, token counting for the batcher, and the texts that warm up and calibrate a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "TokenCounter",
    "calibration_texts",
    "max_length_of",
    "read_json",
    "warmup_text",
]

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


class TokenCounter:
    """A private fast tokenizer for :meth:`count_tokens`, separate from the one ``predict`` uses
    (``tokenizer``: a tokenizer object of its own to take it from; None: transformers' for
    ``path``).

    The event loop may count while the instance thread encodes a batch; the Rust tokenizer
    refuses concurrent use when one caller changes its padding/truncation settings ("Already
    borrowed"), so the counter gets its own copies, configured once and never mutated after:
    one truncating at the model's max length (what a batch costs), one not truncating at all
    (how long an input really is, for request limits).
    """

    # Inputs longer than this many characters per allowed token are first counted on a
    # prefix: encoding a megabyte of text to learn it exceeds 256 tokens would cost ms.
    _CHARS_PER_TOKEN_BOUND = 8

    def __init__(self, path: Path, max_length: int | None, tokenizer: Any = None) -> None:
        if tokenizer is None:
            import transformers  # imports torch: only for folders tokenised by transformers

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


class LazyCounter:
    """A model's :class:`TokenCounter`, built the first time it is asked for, and its max
    length: the model's own once it knows it, else the counter's.

    Lock-free: two threads that race build two equal counters and one is kept (the event loop
    may count before the instance has loaded); without a lock, the model stays picklable for
    process instances.
    """

    def __init__(self, path: Path, max_length: int | None) -> None:
        self.path = path
        #: The model's max length; None until it is known (then the counter's is used).
        self.max_length = max_length
        self._counter: TokenCounter | None = None

    def counter(self) -> TokenCounter:
        counter = self._counter
        if counter is None:
            counter = self._counter = TokenCounter(self.path, self.max_length)
        return counter

    def resolved_max_length(self) -> int:
        if self.max_length is None:
            self.max_length = self.counter().max_length
        return self.max_length


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
