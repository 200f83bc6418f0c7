"""A weight product from a copy of the weight prepacked for oneDNN: the operators, the rows
padded on their way, and the timing that decides where it serves
(:mod:`.packed_products`).

At a decode step's few rows a product reads its whole matrix for little arithmetic. torch's
plain ``linear``/``addmm`` hands the matrix to the BLAS as it is stored, at every call; oneDNN
reads a copy laid out once for its kernels (prepacked as torch's own compiler does when it
freezes weights, and as vLLM's and IPEX's CPU paths do). Which is faster at which row count
depends on the CPU: the load measures both and logs the timings it decided from
(:mod:`.packed_products`). Outputs agree with the plain product to float32 rounding (the sums
are taken in another order).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.nn import functional

__all__ = ["MAX_ROWS", "ROW_STEP", "prepacked_linear", "prepacking_available", "timed"]

#: A prepacked product's rows are padded up to a multiple of this: oneDNN keeps a compiled
#: kernel for every row count it meets, for as long as the process lives, so the counts are
#: kept few.
ROW_STEP = 8
#: Products of more rows (every position of a prompt, for its log-probabilities) take the
#: plain product: no kernel per prompt length.
MAX_ROWS = 64


def prepacked_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x`` (``[rows, in]``, at most :data:`MAX_ROWS` rows) times the prepacked weight
    ``packed``, plus ``bias``; the rows padded up to a multiple of :data:`ROW_STEP` on their
    way to oneDNN."""
    rows = int(x.shape[0])
    padding = -rows % ROW_STEP
    if padding:
        x = functional.pad(x, (0, 0, 0, padding))
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out[:rows] if padding else out


def prepacking_available() -> bool:
    """Whether this torch has oneDNN and the operators that prepack a weight and use it."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def timed(run: Callable[[torch.Tensor], torch.Tensor], sample: torch.Tensor) -> float:
    """The least of a few timings of ``run(sample)``, after one untimed call."""
    run(sample)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        run(sample)
        best = min(best, time.perf_counter() - started)
    return best
