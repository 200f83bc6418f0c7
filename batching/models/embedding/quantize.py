"""Compact encodings of dense vectors (``int8``, ``uint8``, ``binary``, ``ubinary``), exactly as
sentence-transformers' ``quantize_embeddings`` computes them, with int8/uint8 ranges calibrated
once per model on a fixed set of texts.

Calibration: at load, after the engine is chosen, the model embeds :data:`CALIBRATION_COUNT`
(128) fixed English sentences of varied topics, kinds (questions, statements, commands,
fragments) and lengths, as plain texts (so with the model's default prompt, as a plain
request is embedded). The per-dimension minimum and maximum of those vectors are the
int8/uint8 ranges, as ``quantize_embeddings(..., calibration_embeddings=...)`` would derive
them; a ``dimensions`` request's ranges come from the same vectors cut to that width (and
re-normalised when the model's vectors are unit vectors), computed once per width.

The calibration vectors are kept in the engine cache beside the engine choice they were
computed with (:func:`kept_calibration`), so a cached start runs no calibration batch.

numpy and the cache's files: no torch, no model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = [
    "CALIBRATION_COUNT",
    "Calibration",
    "calibration_sentences",
    "kept_calibration",
    "quantize",
    "ranges_of",
    "shorten",
]

#: How many texts calibrate the int8/uint8 ranges.
CALIBRATION_COUNT = 128

_SUBJECTS = (
    "The old lighthouse keeper",
    "A small startup in Berlin",
    "My grandmother's apple pie recipe",
    "The central bank",
    "This laptop's battery",
    "A migrating flock of geese",
    "The new vaccine trial",
    "Our quarterly sales report",
    "The football team's young striker",
    "A quiet mountain village",
    "The open-source database engine",
    "Her first novel",
    "The city's public transport network",
    "An ancient Roman aqueduct",
    "The customer support chatbot",
    "A thunderstorm over the harbour",
)
_PREDICATES = (
    "was rebuilt after the fire last winter",
    "raised interest rates by a quarter of a percentage point",
    "uses far too much sugar and butter, but everyone loves it",
    "lasts barely three hours when streaming video",
    "stopped on the lake for two nights before heading north",
    "reported fewer side effects than the placebo group",
    "shows revenue growth in every region except Asia",
    "scored twice in the final ten minutes of the match",
)
_QUESTIONS = (
    "How do I reset my password if I no longer have access to my email?",
    "What is the capital of Australia?",
    "Why does bread go stale faster in the refrigerator?",
    "Which programming language should I learn first for data analysis?",
    "Can dogs eat grapes?",
    "When does the museum open on Sundays?",
    "Is it safe to run a marathon without training?",
    "How many moons does Jupiter have?",
    "What are the symptoms of vitamin D deficiency?",
    "Where can I find cheap flights to Lisbon in March?",
    "Who wrote the theory of general relativity?",
    "How long should I boil an egg for a soft yolk?",
    "What is the difference between a virus and a bacterium?",
    "Does the warranty cover accidental water damage?",
    "How can I improve my sleep without medication?",
    "What time zone is Tokyo in?",
)
_FRAGMENTS = (
    "error 404 page not found",
    "refund policy",
    "best hiking trails near Zurich",
    "SELECT name FROM users WHERE age > 30;",
    "photosynthesis",
    "2 bedroom apartment, balcony, close to the station",
    "cheap noise cancelling headphones",
    "chapter 7: the industrial revolution",
    "Les feuilles tombent en automne.",
    "Der Zug hat zwanzig Minuten Verspätung.",
    "el mejor restaurante de tapas en Madrid",
    "quantum entanglement explained simply",
    "import numpy as np",
    "thank you so much!!!",
    "terms and conditions apply",
    "ok",
)


def calibration_sentences() -> list[str]:
    """The :data:`CALIBRATION_COUNT` calibration texts, always the same, in the same order."""
    statements = [
        f"{subject} {_PREDICATES[(i + j) % len(_PREDICATES)]}."
        for i, subject in enumerate(_SUBJECTS)
        for j in range(6)
    ]
    texts = [*statements, *_QUESTIONS, *_FRAGMENTS]
    assert len(texts) == CALIBRATION_COUNT
    return texts


def shorten(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first ``dimensions`` of each row (all when None), re-normalised when ``normalize``
    (float32, rows)."""
    if dimensions is None or dimensions >= vectors.shape[-1]:
        return vectors
    cut = np.ascontiguousarray(vectors[..., :dimensions], dtype=np.float32)
    if normalize:
        norms = np.linalg.norm(cut, axis=-1, keepdims=True)
        cut = cut / np.maximum(norms, 1e-12)
    return cut


def ranges_of(vectors: np.ndarray) -> np.ndarray:
    """Per-dimension ``[min, max]`` (``[2, dim]``), as ``quantize_embeddings`` derives them."""
    return np.vstack((np.min(vectors, axis=0), np.max(vectors, axis=0)))


def quantize(vectors: np.ndarray, encoding: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """``vectors`` (float, ``[..., dim]``) in ``encoding``, as sentence-transformers'
    ``quantize_embeddings(vectors, encoding, ranges=ranges)`` (``float`` is its ``float32``).

    :raises ValueError: for an unknown encoding, or int8/uint8 without ranges.
    """
    if encoding == "float":
        return np.asarray(vectors, dtype=np.float32)
    if encoding in ("int8", "uint8"):
        if ranges is None:
            raise ValueError(f"{encoding} needs calibrated ranges")
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        levels: np.ndarray = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        if encoding == "uint8":
            return levels.astype(np.uint8)
        return (levels - 128).astype(np.int8)
    if encoding == "binary":
        return (np.packbits(vectors > 0, axis=-1) - 128).astype(np.int8)
    if encoding == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    raise ValueError(f"encoding {encoding!r} is not float, int8, uint8, binary or ubinary")


class Calibration:
    """A model's calibration vectors and the int8/uint8 ranges derived from them, per width.

    :param vectors: the calibration texts' dense float vectors ``[n, dim]``.
    :param normalize: the model's vectors are unit vectors (a shortened width is re-normalised).
    """

    def __init__(self, vectors: np.ndarray, normalize: bool) -> None:
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.normalize = normalize
        self._ranges: dict[int, np.ndarray] = {self.vectors.shape[1]: ranges_of(self.vectors)}

    def ranges(self, width: int | None = None) -> np.ndarray:
        """The ``[2, width]`` ranges (full width when None), computed once per width."""
        full = int(self.vectors.shape[1])
        width = full if width is None or width >= full else width
        found = self._ranges.get(width)
        if found is None:
            # No lock: a race computes equal ranges twice, and one wins.
            found = self._ranges[width] = ranges_of(shorten(self.vectors, width, self.normalize))
        return found

    def describe(self) -> list[list[float]]:
        """The full-width ranges as JSON lists: ``[[min per dim], [max per dim]]``."""
        return [[float(x) for x in row] for row in self.ranges()]


def kept_calibration(
    cache: Path | None, key: object, compute: Callable[[], np.ndarray]
) -> np.ndarray:
    """The calibration vectors ``compute`` makes, kept in the engine cache folder ``cache``
    under ``key`` (JSON: everything they depend on), and read from it while they are there;
    ``cache`` None: computed each time. A cache that cannot be written only costs the next
    start the computation again."""
    if cache is None:
        return compute()
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]
    path = cache / "calibration" / f"{digest}.npy"
    try:
        vectors: np.ndarray = np.load(path)
        return vectors
    except (OSError, ValueError):
        pass
    vectors = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        with temporary.open("wb") as handle:
            np.save(handle, vectors)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only cache: computed again at the next start
    return vectors
