"""A generating model's weight products on the CPU, served from oneDNN-prepacked copies of
their weights (:mod:`.prepacked`) where that measures faster on the machine the model loads
on: the output layer of every generating model (:func:`pack_output_layer`) and the layers'
products of a fused step (:mod:`.fused_step`, :func:`pack_products`), by one rule.

A decode step's products are small: a few rows times each matrix, so each reads its whole
matrix for little arithmetic, which oneDNN's prepacked layout does faster from a few rows on
(``benchmarks/decode_profile.py --paths fused,plain`` steps both ways). At one row the plain
product can be the faster one, so each size goes the way that measured faster.

The rule: for each shape of weight, one product of that shape is timed both ways at each of
:data:`ROWS` rows, the two in turn (:data:`ROUNDS` rounds, fewer where a round takes long).
Products of that shape are served from their prepacked copies from the fewest rows at which
they were faster by :data:`MARGIN` at that size and every larger one measured, up to
:data:`.prepacked.MAX_ROWS` rows (a short prompt's prefill too); below that, above it, and
when they never were faster, the plain product serves (and no copy is kept when never).
oneDNN keeps a compiled kernel for every row count it is given, so the rows are padded up to a
multiple of :data:`.prepacked.ROW_STEP`: a few kernels per shape, not one per prompt length.
No copies are made when they would hold more than :data:`MAX_PACKED_BYTES`, or when this torch
lacks the operators; an output layer of fewer than :data:`MIN_PARAMETERS` weights sits in the
caches and is not timed. Results agree with the plain product to float32 rounding (the sums
are taken in another order).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .prepacked import MAX_ROWS, prepacked_linear, prepacking_available, timed

__all__ = [
    "MARGIN",
    "MAX_PACKED_BYTES",
    "MIN_PARAMETERS",
    "PACKED_FOR",
    "ROWS",
    "Product",
    "pack_output_layer",
    "pack_products",
]

#: The row counts both ways are timed at (64: a prefill's tokens).
ROWS = (1, 2, 4, 8, 16, 64)
#: The rows the copies are laid out for (a decode step's usual count).
PACKED_FOR = 16
#: How much faster the prepacked product must be at a size to serve it.
MARGIN = 0.1
#: The most memory the prepacked copies may take (one more copy of every product's weights).
MAX_PACKED_BYTES = 1 << 30
#: Output layers with fewer weights are left as they are (not timed).
MIN_PARAMETERS = 2_000_000
#: Rounds of timings at each size, both ways in turn; fewer once a size's took
#: :data:`ENOUGH_S` seconds.
ROUNDS = 3
ENOUGH_S = 0.05


class Product:
    """One weight product ``x @ weight^T + bias`` of a fused step, ``x`` of ``[rows, in]``:
    prepacked from :attr:`min_rows` to :data:`.prepacked.MAX_ROWS` rows, plain at other
    sizes (or always, without a prepacked copy). ``input_major``: the weight is stored ``[in,
    out]`` (GPT-2's ``Conv1D``), not ``[out, in]`` (``nn.Linear``)."""

    __slots__ = ("bias", "input_major", "min_rows", "packed", "weight")

    def __init__(self, weight: Tensor, bias: Tensor | None, *, input_major: bool) -> None:
        self.weight = weight
        self.bias = bias
        self.input_major = input_major
        self.packed: Tensor | None = None
        self.min_rows = 0

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed is not None and self.min_rows <= int(x.shape[0]) <= MAX_ROWS:
            return self.prepacked(x)
        return self.plain(x)

    def plain(self, x: Tensor) -> Tensor:
        if not self.input_major:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.mm(x, self.weight)
        return torch.addmm(self.bias, x, self.weight)

    def prepacked(self, x: Tensor) -> Tensor:
        """From the prepacked copy (:func:`.prepacked.prepacked_linear`: rows padded to a
        multiple of :data:`.prepacked.ROW_STEP`)."""
        assert self.packed is not None
        return prepacked_linear(x, self.packed, self.bias)

    def pack(self, rows: int) -> None:
        """Make the prepacked copy (laid out for ``rows`` rows)."""
        weight = self.weight.detach()
        out_in = weight.t().contiguous() if self.input_major else weight
        self.packed = torch.ops.mkldnn._reorder_linear_weight(out_in, rows)


def pack_products(layers: Sequence[Sequence[Product]]) -> str | None:
    """Serve every layer's products prepacked from the fewest rows at which that measured
    faster, decided per weight shape (on the first layer's product of that shape); what was
    measured and decided (None: not a candidate: no products, not float32 on the CPU, or no
    prepacking in this torch)."""
    products = [product for layer in layers for product in layer]
    if not _candidates(products):
        return None
    total = sum(product.nbytes for product in products)
    if total > MAX_PACKED_BYTES:
        return (
            f"layer products left plain (prepacked copies would take {total >> 20} MiB, "
            f"over {MAX_PACKED_BYTES >> 20} MiB)"
        )
    shapes: dict[tuple[int, int], list[Product]] = {}
    for product in products:
        shapes.setdefault(_shape(product), []).append(product)
    decisions, added = [], 0
    for shape, alike in shapes.items():
        try:
            start, measured = _decide(alike[0])
        except RuntimeError:  # this torch's oneDNN cannot: everything plain
            for product in products:
                product.packed = None
            return None
        name = "x".join(str(size) for size in shape)
        if start is None:
            decisions.append(f"{name} plain ({measured})")
            continue
        for product in alike:
            if product.packed is None:
                product.pack(PACKED_FOR)
            product.min_rows = start
            added += product.nbytes
        decisions.append(f"{name} prepacked from {start} rows ({measured})")
    return (
        f"layer products (in x out; microseconds prepacked/plain at each row count) for "
        f"oneDNN, {added >> 20} MiB of prepacked copies: " + "; ".join(decisions)
    )


def pack_output_layer(model: Any) -> str | None:
    """Serve ``model``'s output layer from a oneDNN-prepacked copy from the fewest rows at
    which that measured faster, by :func:`pack_products`' rule; what was measured and decided
    (None: not a candidate: not a float32 ``nn.Linear`` on the CPU, under
    :data:`MIN_PARAMETERS` weights, or no prepacking in this torch). The layer keeps its
    weight (tied embeddings and the log-probability paths read it); its forward takes the
    product."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.weight.numel() < MIN_PARAMETERS:
        return None
    bias = None if head.bias is None else head.bias.detach()
    product = Product(head.weight.detach(), bias, input_major=False)
    if not _candidates([product]):
        return None
    if product.nbytes > MAX_PACKED_BYTES:
        return f"output layer left plain (a prepacked copy would take {product.nbytes >> 20} MiB)"
    try:
        start, measured = _decide(product)
    except RuntimeError:
        return None
    measured = f"microseconds prepacked/plain at each row count: {measured}"
    if start is None:
        return f"output layer left plain ({measured})"

    def forward(hidden: Tensor) -> Tensor:
        out = product(hidden.reshape(-1, hidden.shape[-1]))
        return out.reshape(*hidden.shape[:-1], out.shape[-1])

    head.forward = forward  # type: ignore[method-assign,assignment]
    return f"output layer served prepacked for oneDNN from {start} rows ({measured})"


def _candidates(products: Sequence[Product]) -> bool:
    """Whether ``products`` can be prepacked: some, all float32 on the CPU, and this torch has
    the operators."""
    return (
        bool(products)
        and prepacking_available()
        and all(p.weight.device.type == "cpu" and p.weight.dtype == torch.float32 for p in products)
    )


def _decide(product: Product) -> tuple[int | None, str]:
    """Time ``product`` both ways (prepacking it first) and keep its copy only if it serves:
    the fewest rows it serves prepacked from (None: never), and what was measured.

    :raises RuntimeError: this torch's oneDNN cannot prepack it.
    """
    product.pack(PACKED_FOR)
    times = _measure(product)
    start = _first_faster(times)
    measured = ", ".join(
        f"{rows}: {packed * 1e6:.0f}/{plain * 1e6:.0f}"
        for rows, (packed, plain) in zip(ROWS, times, strict=True)
    )
    if start is None:
        product.packed = None
    else:
        product.min_rows = start
    return start, measured


def _shape(product: Product) -> tuple[int, int]:
    """The product's ``(in, out)``."""
    rows, columns = (int(size) for size in product.weight.shape)
    return (rows, columns) if product.input_major else (columns, rows)


def _measure(product: Product) -> list[tuple[float, float]]:
    """Per :data:`ROWS` count: (prepacked, plain) seconds, the two in turn, in up to
    :data:`ROUNDS` rounds: fewer once a size's timings have taken :data:`ENOUGH_S` (a large
    output layer's products take milliseconds each, steady enough; the start is not held)."""
    width = int(product.weight.shape[0 if product.input_major else 1])
    results = []
    with torch.inference_mode():
        for rows in ROWS:
            sample = torch.randn(rows, width)
            packed = plain = float("inf")
            started = time.perf_counter()
            for _ in range(ROUNDS):
                packed = min(packed, timed(product.prepacked, sample))
                plain = min(plain, timed(product.plain, sample))
                if time.perf_counter() - started >= ENOUGH_S:
                    break
            results.append((packed, plain))
    return results


def _first_faster(times: Sequence[tuple[float, float]]) -> int | None:
    """The fewest of :data:`ROWS` from which the prepacked product was faster by
    :data:`MARGIN` at every size measured, or None."""
    start = None
    for rows, (packed, plain) in reversed(list(zip(ROWS, times, strict=True))):
        if packed > plain * (1 - MARGIN):
            break
        start = rows
    return start
