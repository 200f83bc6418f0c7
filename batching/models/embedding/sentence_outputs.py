"""What the sentence embedder answers besides its vectors: its metadata (what the doors and
``/v2/models/{name}`` read of it), an engine's output as a float32 array, and what a decode
item costs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..items import EMBEDDING_KEY, ENCODINGS, DecodeItem
from .prompts import Prompts
from .quantize import CALIBRATION_COUNT

__all__ = ["as_array", "described", "ids_of"]


def described(
    *,
    dimension: int,
    normalize: bool,
    prompts: Prompts,
    max_seq_length: int,
    ranges: object,
    vocab_size: int | None,
    token_dimension: object,
    engine: object,
) -> dict[str, object]:
    """The embedder's metadata: its one input and output, what an embedding item may ask
    (``EMBEDDING_KEY``), and the engine that serves it (when loaded)."""
    return {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {
                "name": "embedding",
                "datatype": "FP32",
                "shape": [-1, dimension],
                # Unit vectors or not: the OpenAI door's `dimensions` needs unit vectors.
                "normalized": normalize,
            }
        ],
        EMBEDDING_KEY: {
            "prompts": dict(prompts.prompts),
            "default_prompt_name": prompts.default_name,
            "default_prompt": prompts.default,
            "max_seq_length": max_seq_length,
            "normalized": normalize,
            "outputs": ["dense", "tokens"],
            "encodings": list(ENCODINGS),
            "quantization_ranges": ranges,
            "calibration_texts": CALIBRATION_COUNT,
            "truncation_directions": ["right", "left"],
            "tokenize": True,
            # What /decode checks ids against, and the width of a per-token vector (the
            # encoder's, before pooling).
            "vocab_size": vocab_size,
            "token_dimension": token_dimension,
        },
        **({"engine": engine} if engine is not None else {}),
    }


def ids_of(item: object) -> Sequence[int]:
    """The ids of a :class:`DecodeItem` (what it costs); none for anything else."""
    return item.ids if isinstance(item, DecodeItem) else ()


def as_array(output: object) -> np.ndarray:
    """An engine's output as a float32 numpy array (a torch runner returns a tensor)."""
    if isinstance(output, np.ndarray):
        return output if output.dtype == np.float32 else output.astype(np.float32)
    import torch  # a torch runner answered: torch is loaded already

    if not isinstance(output, torch.Tensor):
        raise TypeError(f"an engine answered {type(output).__name__}, not an array")
    return np.asarray(output.detach().float().cpu().numpy())
