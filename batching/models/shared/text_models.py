"""What the text models share without torch: reading a folder's JSON, the longest input a model
takes, token counting for the batcher, and the texts that warm up and calibrate a model."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the counter's backend, when the tokenizer has one
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "NO_LIMIT",
    "CountedTokenizer",
    "LazyCounter",
    "TokenCounter",
    "calibration_texts",
    "max_length_of",
    "position_limit",
    "read_config",
    "read_json",
    "warmup_text",
]

#: A tokenizer without a configured limit reports a huge sentinel as ``model_max_length``
#: (transformers' ``int(1e30)``): anything this large or larger is no limit.
NO_LIMIT = 1_000_000
#: The longest input of a model whose tokenizer and config name no limit.
DEFAULT_MAX_LENGTH = 512

#: The families whose position ids start after the padding index (RoBERTa's scheme): a table
#: of ``max_position_embeddings`` rows holds ``pad_token_id + 1`` fewer tokens (514: 512).
#: BART's learned offset and M2M100's are inside the table: their ``max_position_embeddings``
#: is the count of tokens.
_PADDING_OFFSET = frozenset(
    {
        *("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text"),
        *("roberta-prelayernorm", "xmod", "ibert", "longformer", "mpnet", "luke", "lilt"),
        *("markuplm", "layoutlmv3"),
    }
)

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


class CountedTokenizer(Protocol):
    """What the counter calls of a tokenizer object (transformers', or a folder's
    ``tokenizer.json`` read without transformers): one text, or one pair, to its ids."""

    def __call__(
        self,
        text: str,
        text_pair: str | None = None,
        *,
        truncation: bool = False,
        max_length: int | None = None,
        verbose: bool = True,
    ) -> Mapping[str, Sequence[int]]: ...


def read_json(path: Path) -> object:
    with path.open(encoding="utf-8") as handle:
        document: object = json.load(handle)
    return document


def read_config(path: Path) -> dict[str, object]:
    """A JSON object file of a model folder (``config.json``, ...), its values to be narrowed
    where they are read; {} for a document that is not an object."""
    document = read_json(path)
    return document if isinstance(document, dict) else {}


def _limit(value: object) -> int | None:
    """``value`` when it is a real limit: a positive int below :data:`NO_LIMIT`."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < NO_LIMIT:
        return value
    return None


def position_limit(config: object) -> int | None:
    """The most tokens the model's position table takes, from its config (``config.json``
    as read, or a transformers config object): ``max_position_embeddings``, or GPT-2's
    ``n_positions``, whichever is smaller, less ``pad_token_id + 1`` in the RoBERTa-style
    families (:data:`_PADDING_OFFSET`). None: the config names no bound (T5's relative
    positions)."""
    if not isinstance(config, Mapping):
        to_dict = getattr(config, "to_dict", None)
        config = to_dict() if callable(to_dict) else {}
        if not isinstance(config, Mapping):
            return None
    tables = [
        limit
        for limit in (_limit(config.get(key)) for key in ("max_position_embeddings", "n_positions"))
        if limit is not None
    ]
    if not tables:
        return None
    positions = min(tables)
    if config.get("model_type") in _PADDING_OFFSET:
        pad = config.get("pad_token_id")
        positions -= (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
    return positions if positions > 0 else None


def max_length_of(
    tokenizer: object,
    config: object,
    declared: int | None = None,
    default: int = DEFAULT_MAX_LENGTH,
) -> int:
    """The longest input the model takes, in tokens (special tokens included): the smallest
    real limit of ``declared`` (sentence-transformers' ``max_seq_length``, or the operator's),
    the tokenizer's ``model_max_length`` (unless it is transformers' sentinel for none) and
    the model's positions (:func:`position_limit`); ``default`` when none is known.

    Every text model computes its limit here, so a tokenizer that allows more than the
    model's position table (or names no limit) never lets a long text reach the model."""
    limits = [
        limit
        for limit in (
            _limit(declared),
            _limit(getattr(tokenizer, "model_max_length", None)),
            position_limit(config),
        )
        if limit is not None
    ]
    return min(limits, default=default)


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

    def __init__(
        self, path: Path, max_length: int | None, tokenizer: CountedTokenizer | None = None
    ) -> None:
        if tokenizer is None:
            import transformers  # imports torch: only for folders tokenised by transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        config_path = path / "config.json"
        config = read_config(config_path) if config_path.is_file() else {}
        # ``max_length`` is an upper bound (the model's, or a declared one): never past what
        # the tokenizer and the position table allow.
        self.max_length = max_length_of(tokenizer, config, max_length)
        mask = getattr(tokenizer, "mask_token", None)
        self.mask_token: str | None = mask if isinstance(mask, str) else None
        backend: Tokenizer | None = getattr(tokenizer, "backend_tokenizer", None)
        self._backend: Tokenizer | None = None
        self._full_backend: Tokenizer | None = None
        self._tokenizer = tokenizer
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
    def tokenizer(self) -> CountedTokenizer:
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
    length (:func:`max_length_of`): resolved by the model at load from its own tokenizer, else
    by the counter.

    Lock-free: two threads that race build two equal counters and one is kept (the event loop
    may count before the instance has loaded); without a lock, the model stays picklable for
    process instances.

    :param declared: a limit the folder or the operator sets (sentence-transformers'
        ``max_seq_length``); the resolved length is never above it.
    """

    def __init__(self, path: Path, declared: int | None = None) -> None:
        self.path = path
        self.declared = declared
        #: The model's max length; None until it is known (then the counter's is used).
        self.max_length: int | None = None
        self._counter: TokenCounter | None = None

    def counter(
        self, tokenizer: Callable[[], CountedTokenizer | None] | None = None
    ) -> TokenCounter:
        """The counter (``tokenizer``: called when it is built, for the tokenizer object it
        takes; None, or None returned: transformers' for the folder)."""
        counter = self._counter
        if counter is None:
            bound = self.declared if self.max_length is None else self.max_length
            own = tokenizer() if tokenizer is not None else None
            counter = self._counter = TokenCounter(self.path, bound, own)
        return counter

    def resolve(self, tokenizer: object, config: object) -> int:
        """The max length from the model's loaded ``tokenizer`` and ``config``, kept."""
        self.max_length = max_length_of(tokenizer, config, self.declared)
        return self.max_length

    def resolved_max_length(
        self, tokenizer: Callable[[], CountedTokenizer | None] | None = None
    ) -> int:
        """The max length, from the counter (built with ``tokenizer``) until the model
        resolves it."""
        if self.max_length is None:
            self.max_length = self.counter(tokenizer).max_length
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
