"""The lengths traffic has: what the variants are timed at, and how their timings at each
length are weighed into one cost per batch size.

The ranking of engines changes with the input length (one engine's fixed cost per call
dominates a short sentence, another's per-token cost a long text), so timing only the
longest input ranks them for traffic few servers see. The variants are timed at
:func:`timing_lengths`: :data:`SHORT_TOKENS` tokens, the longest input the model takes, and the
median padded length the server has served when the engine cache knows it
(:class:`TrafficLengths`, written by the serving process). A variant's cost at a batch size is
the weighted mean of its seconds per item at those lengths (:func:`combined_rate`), the
weights being the share of served items nearest to each length, or :data:`DEFAULT_WEIGHTS`
before any traffic was seen (most requests carry a sentence or two).

Pure, but for reading and writing the lengths file; no ML library (the plan imports it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_WEIGHTS",
    "FILE",
    "SHORT_TOKENS",
    "TrafficLengths",
    "combined_rate",
    "shorter",
    "timing_lengths",
    "weights",
]

#: The short length timed: a sentence of a dozen words with its special tokens.
SHORT_TOKENS = 16
#: The weights of the short and the longest length before any traffic was seen.
DEFAULT_WEIGHTS = {"short": 0.75, "long": 0.25}
#: The file in a model's engine cache folder that keeps the lengths served.
FILE = "lengths.json"
#: Items counted before the counts are halved (recent traffic weighs more than old).
_CAP = 1_000_000


class TrafficLengths:
    """How many items the server ran at each padded length (tokens per item of their batch)."""

    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})
        #: The items counted (kept as they are added: :meth:`add` runs once per batch).
        self.items = sum(self.counts.values())
        self.changed = False

    def add(self, items: int, tokens: int) -> None:
        """A batch of ``items`` items padded to ``tokens`` tokens ran."""
        if items <= 0 or tokens <= 0:
            return
        self.counts[tokens] = self.counts.get(tokens, 0) + items
        self.items += items
        self.changed = True
        if self.items > _CAP:
            self.counts = {k: v // 2 for k, v in self.counts.items() if v // 2}
            self.items = sum(self.counts.values())

    def median(self) -> int | None:
        """The padded length of the median item served; None before any."""
        total = self.items
        if not total:
            return None
        seen = 0
        for tokens in sorted(self.counts):
            seen += self.counts[tokens]
            if 2 * seen >= total:
                return tokens
        return max(self.counts)  # pragma: no cover - the loop always returns

    @classmethod
    def load(cls, folder: Path | None) -> TrafficLengths:
        """What ``folder`` (a model's engine cache folder) keeps; empty when nothing."""
        if folder is None:
            return cls()
        try:
            data = json.loads((folder / FILE).read_text(encoding="utf-8"))
            return cls({int(k): int(v) for k, v in data["items_by_tokens"].items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls()

    def save(self, folder: Path) -> None:
        """Write the counts into ``folder`` (atomically; a read-only cache keeps none)."""
        text = json.dumps({"items_by_tokens": {str(k): v for k, v in sorted(self.counts.items())}})
        try:
            handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=folder)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, folder / FILE)
        except OSError:
            return
        self.changed = False


def timing_lengths(longest: int, seen: TrafficLengths | None = None) -> tuple[int, ...]:
    """The lengths (tokens) to time at: short, the median served (when known), the longest."""
    lengths = {max(1, min(SHORT_TOKENS, longest)), longest}
    median = seen.median() if seen is not None else None
    if median is not None:
        lengths.add(max(1, min(median, longest)))
    return tuple(sorted(lengths))


def weights(lengths: tuple[int, ...], seen: TrafficLengths | None = None) -> dict[int, float]:
    """Each timed length's weight in the cost: the share of served items whose padded length
    is nearest to it (on a log scale), or :data:`DEFAULT_WEIGHTS` before any traffic."""
    if len(lengths) == 1:
        return {lengths[0]: 1.0}
    if seen is None or not seen.items:
        short, long = lengths[0], lengths[-1]
        found = {length: 0.0 for length in lengths}
        found[short] += DEFAULT_WEIGHTS["short"]
        found[long] += DEFAULT_WEIGHTS["long"]
        return found
    found = {length: 0.0 for length in lengths}
    for tokens, count in seen.counts.items():
        nearest = min(lengths, key=lambda length: abs(math.log(length / tokens)))
        found[nearest] += count
    total = sum(found.values())
    return {length: share / total for length, share in found.items()}


def combined_rate(rates: Mapping[int, float], weighting: Mapping[int, float]) -> float:
    """Items per second over traffic of the lengths ``weighting`` describes: the inverse of
    the weighted mean of seconds per item at each length (``rates``: length -> items/s)."""
    seconds = sum(share / max(rates[length], 1e-9) for length, share in weighting.items() if share)
    return 1.0 / seconds if seconds > 0 else 0.0


def shorter(batch: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """``batch`` (a tokenizer's arrays or tensors, items by tokens) cut to its first ``tokens``
    tokens: what a batch of that length costs, for timing (the text does not matter)."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) != 2 or shape[1] <= tokens:
            out[name] = value
            continue
        cut = value[:, :tokens]  # a numpy array's copy, or a torch tensor's, is contiguous
        out[name] = cut.contiguous() if hasattr(cut, "contiguous") else cut.copy()
    return out
