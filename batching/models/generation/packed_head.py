"""A generating model's output layer on the CPU, prepacked for oneDNN where that measures
faster on the machine the model loads on.

Each decode step ends with the output layer: every row's hidden state times the vocabulary's
matrix (vocabulary x width; 30,522 x 256 is 31 MB in fp32). At a decode step's few rows that
product reads the whole matrix for little arithmetic, and torch's plain ``linear`` reads it in
the order it is stored, which measured 4.6 ms for one row and 9.7 ms for 16 on a 2-core EPYC
(about a quarter of a step). oneDNN reads a copy laid out for its kernels (prepacked once, as
torch's own compiler does when it freezes weights, and as vLLM's and IPEX's CPU paths do):
2.8 and 4.0 ms there.

What is done: at load, for a float32 output layer on the CPU of at least
:data:`MIN_PARAMETERS` weights (below that the matrix sits in the caches and plain ``linear``
is as fast), both ways are timed at one row and at :data:`ROWS` rows; the prepacked one
serves only if it is faster by :data:`MARGIN`. The layer keeps its weight (tied embeddings
and the log-probability paths read it); its forward uses the prepacked copy (its memory: one
more copy of the matrix). Outputs agree with plain ``linear`` to float32 rounding (the sums
are taken in another order).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = [
    "MARGIN",
    "MAX_ROWS",
    "MIN_PARAMETERS",
    "ROWS",
    "ROW_STEP",
    "pack_output_layer",
    "prepacked_linear",
    "prepacking_available",
    "timed",
]

#: Output layers with fewer weights are left as they are.
MIN_PARAMETERS = 2_000_000
#: The rows a decode step usually has (the batch cap's default order); the copy is laid out
#: for it.
ROWS = 16
#: How much faster the prepacked layer must be (both sizes' times summed).
MARGIN = 0.1
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


def pack_output_layer(model: Any) -> str | None:
    """Serve ``model``'s output layer from a oneDNN-prepacked copy where that is faster; what
    was measured and decided (None: not a candidate)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or not prepacking_available():
        return None
    weight, bias = head.weight.detach(), None if head.bias is None else head.bias.detach()
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    if weight.numel() < MIN_PARAMETERS:
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS)
    except RuntimeError:
        return None

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        if int(flat.shape[0]) > MAX_ROWS:
            return plain(hidden)
        out = prepacked_linear(flat, packed, bias)
        return out.reshape(*hidden.shape[:-1], out.shape[-1])

    def plain(hidden: torch.Tensor) -> torch.Tensor:
        return functional.linear(hidden, weight, bias)

    samples = [torch.randn(rows, 1, weight.shape[1]) for rows in (1, ROWS)]
    with torch.inference_mode():
        try:
            packed_s = [timed(forward, sample) for sample in samples]
        except RuntimeError:
            return None
        plain_s = [timed(plain, sample) for sample in samples]
    measured = (
        f"{packed_s[0] * 1e3:.1f}/{packed_s[1] * 1e3:.1f} ms prepacked against "
        f"{plain_s[0] * 1e3:.1f}/{plain_s[1] * 1e3:.1f} ms plain at 1/{ROWS} rows"
    )
    if sum(packed_s) > sum(plain_s) * (1 - MARGIN):
        return f"output layer left plain ({measured})"
    head.forward = forward  # type: ignore[method-assign,assignment]
    return f"output layer served prepacked for oneDNN ({measured})"


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
