"""What an embedding request got, whatever its door: the vectors, which texts the model cut,
and the tokens used (the data plane makes it: :mod:`batching.plane.embedding`; each door
encodes it in its own format)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EmbedAnswer"]


@dataclass(frozen=True, slots=True)
class EmbedAnswer:
    """What an embedding request got: one vector per text, in order."""

    vectors: list[np.ndarray]
    #: Per text, whether the model cut it at its maximum length; None when not known.
    truncated: list[bool] | None
    #: Tokens the model ran, prompts included (usage); None when the model cannot count.
    tokens: int | None
