"""The accuracy check: does a variant's output match torch fp32's on the calibration set?

Each task has its own measure, on what the caller will actually see:

- ``embedding``: every vector's cosine with torch fp32's is at least :data:`MIN_COSINE`;
- ``classification``: the same label for every input, and every score within
  :data:`MAX_SCORE_GAP`;
- ``fill-mask``: the same top-k tokens, in the same order, at every mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_SCORE_GAP", "MEASURES", "MIN_COSINE", "TOP_K", "Accuracy", "compare"]

MIN_COSINE = 0.9999
MAX_SCORE_GAP = 1e-3
#: The candidates fill-mask returns by default, so the ones that must not change.
TOP_K = 5
MEASURES = ("embedding", "classification", "fill-mask")


@dataclass(frozen=True, slots=True)
class Accuracy:
    ok: bool
    #: The figure behind ``ok``: min cosine, max score gap, or share of identical top-k.
    figure: float
    text: str


def compare(measure: str, reference: np.ndarray, candidate: np.ndarray) -> Accuracy:
    """Check ``candidate`` against ``reference`` (rows: one per input, or per mask).

    :param measure: one of :data:`MEASURES`; the arrays are embeddings (rows of vectors),
        scores (rows of label scores) or logits at the masks (rows of vocabulary logits).
    """
    reference = np.asarray(reference, dtype=np.float64)
    candidate = np.asarray(candidate, dtype=np.float64)
    if reference.shape != candidate.shape:
        return Accuracy(False, 0.0, f"shape {candidate.shape} instead of {reference.shape}")
    if not np.isfinite(candidate).all():
        return Accuracy(False, 0.0, "non-finite outputs")
    if measure == "embedding":
        norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(candidate, axis=1)
        cosine = (reference * candidate).sum(axis=1) / np.maximum(norms, 1e-12)
        low = float(cosine.min())
        return Accuracy(low >= MIN_COSINE, low, f"min cosine {low:.6f} (>= {MIN_COSINE})")
    if measure == "classification":
        same = bool((reference.argmax(axis=1) == candidate.argmax(axis=1)).all())
        gap = float(np.abs(reference - candidate).max())
        labels = "same labels" if same else "different labels"
        return Accuracy(same and gap <= MAX_SCORE_GAP, gap, f"{labels}, max score gap {gap:.2e}")
    if measure == "fill-mask":
        k = min(TOP_K, reference.shape[1])
        top_reference = np.argsort(-reference, axis=1, kind="stable")[:, :k]
        top_candidate = np.argsort(-candidate, axis=1, kind="stable")[:, :k]
        share = float((top_reference == top_candidate).all(axis=1).mean())
        return Accuracy(share == 1.0, share, f"same top-{k} at {share:.0%} of the masks")
    raise ValueError(f"unknown accuracy measure {measure!r}")
