"""A fused step's weight products served from oneDNN-prepacked copies from the fewest rows at
which that measured faster (batching.models.generation.packed_products): the same results as
the plain products, each size routed by what was measured, no copies when they never win or
would take too much memory, the decision logged when the model loads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from batching.models.generation import packed_products
from batching.models.generation.causal import TextGenerator
from batching.models.generation.packed_products import ROWS, Product, pack_products
from batching.models.generation.prepacked import MAX_ROWS, ROW_STEP
from tests.support.generators import gpt2_folder


def _layers(count: int = 2, width: int = 32) -> list[list[Product]]:
    """GPT-2-like (input-major, biased) and Llama-like (output-major, unbiased) products."""
    torch.manual_seed(0)
    return [
        [
            Product(torch.randn(width, 3 * width), torch.randn(3 * width), input_major=True),
            Product(torch.randn(2 * width, width), None, input_major=False),
        ]
        for _ in range(count)
    ]


def _timings(monkeypatch: pytest.MonkeyPatch, faster_at: set[int]) -> Callable[[], list[Product]]:
    """``_measure`` gives the prepacked product as faster at ``faster_at`` rows (and slower
    at the others): the decision is the test's, not the machine's. Returns what was timed."""
    timed: list[Product] = []

    def measure(product: Product) -> list[tuple[float, float]]:
        timed.append(product)
        return [(1.0, 2.0) if rows in faster_at else (2.0, 1.0) for rows in ROWS]

    monkeypatch.setattr(packed_products, "_measure", measure)
    return lambda: timed


def test_each_size_goes_the_way_that_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = _timings(monkeypatch, faster_at={4, 8, 16, 64})
    layers = _layers()
    decided = pack_products(layers)
    assert decided is not None
    assert "32x96 prepacked from 4 rows" in decided and "32x64 prepacked from 4 rows" in decided
    # Each shape's first product was the one timed.
    assert timed() == [layers[0][0], layers[0][1]]
    assert all(p.packed is not None and p.min_rows == 4 for layer in layers for p in layer)
    calls: list[str] = []
    plain, prepacked = Product.plain, Product.prepacked

    def spy(name: str, real: Callable[[Product, torch.Tensor], torch.Tensor]) -> Any:
        return lambda self, x: calls.append(name) or real(self, x)

    monkeypatch.setattr(Product, "plain", spy("plain", plain))
    monkeypatch.setattr(Product, "prepacked", spy("prepacked", prepacked))
    product = layers[1][0]
    for rows in (1, 3, 4, 40, MAX_ROWS, MAX_ROWS + 1):
        product(torch.randn(rows, 32))
    # Past MAX_ROWS (a long prompt's prefill): plain again.
    assert calls == ["plain", "plain", "prepacked", "prepacked", "prepacked", "plain"]


def test_onednn_meets_few_row_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN keeps a kernel per row count it meets: the rows reach it padded to multiples of
    ROW_STEP, and the answer has the caller's rows."""
    product = _layers(1)[0][0]
    product.pack(16)
    real = torch.ops.mkldnn._linear_pointwise
    seen: list[int] = []

    def spy(x: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append(int(x.shape[0]))
        return real(x, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    for rows in range(1, MAX_ROWS + 1):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(product.prepacked(x), product.plain(x), rtol=1e-5, atol=1e-5)
    assert len(seen) == MAX_ROWS
    assert all(count % ROW_STEP == 0 for count in seen)
    assert len(set(seen)) == MAX_ROWS // ROW_STEP


def test_a_size_that_measured_slower_keeps_every_smaller_one_plain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faster at 1 and 2 rows but not at 4 or 8: only 16 rows and more go prepacked (a prefill's
    tokens count as rows too, so the larger sizes decide)."""
    _timings(monkeypatch, faster_at={1, 2, 16, 64})
    layers = _layers()
    decided = pack_products(layers)
    assert decided is not None and "32x96 prepacked from 16 rows" in decided
    assert all(product.min_rows == 16 for layer in layers for product in layer)


def test_products_that_never_measure_faster_get_no_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _timings(monkeypatch, faster_at={1, 2, 4, 8, 16})  # slower at 64 (a prefill's tokens)
    layers = _layers()
    decided = pack_products(layers)
    assert decided is not None and "0 MiB of prepacked copies" in decided
    assert "32x96 plain" in decided and "32x64 plain" in decided
    assert all(product.packed is None for layer in layers for product in layer)


def test_each_shape_is_decided_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """One shape measured faster prepacked, the other not: only the first gets copies."""

    def measure(product: Product) -> list[tuple[float, float]]:
        faster = product.input_major
        return [(1.0, 2.0) if faster else (2.0, 1.0)] * len(ROWS)

    monkeypatch.setattr(packed_products, "_measure", measure)
    layers = _layers()
    decided = pack_products(layers)
    assert decided is not None and "32x96 prepacked from 1 rows" in decided
    assert "32x64 plain" in decided
    assert all(layer[0].packed is not None and layer[1].packed is None for layer in layers)


def test_copies_over_the_memory_bound_are_not_made_nor_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed = _timings(monkeypatch, faster_at=set(ROWS))
    monkeypatch.setattr(packed_products, "MAX_PACKED_BYTES", 1000)
    layers = _layers()
    decided = pack_products(layers)
    assert decided is not None and "left plain" in decided and "over" in decided
    assert timed() == []
    assert all(product.packed is None for layer in layers for product in layer)


def test_not_a_candidate_off_float32() -> None:
    layers = [[Product(torch.randn(8, 8, dtype=torch.float64), None, input_major=False)]]
    assert pack_products(layers) is None
    assert pack_products([]) is None


@pytest.mark.parametrize("input_major", [True, False])
@pytest.mark.parametrize("biased", [True, False])
def test_a_prepacked_product_equals_the_plain_one(input_major: bool, biased: bool) -> None:
    """oneDNN's own kernels on this machine, no timings involved: float32 rounding apart."""
    torch.manual_seed(1)
    weight = torch.randn(64, 96) if input_major else torch.randn(96, 64)
    product = Product(weight, torch.randn(96) if biased else None, input_major=input_major)
    product.pack(16)
    for rows in (1, 5, 16, 70):
        x = torch.randn(rows, 64)
        with torch.inference_mode():
            expected = x @ (weight if input_major else weight.t())
            if biased:
                assert product.bias is not None
                expected = expected + product.bias
            torch.testing.assert_close(product.prepacked(x), expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(product.plain(x), expected, rtol=1e-5, atol=1e-5)


def test_a_text_generator_logs_its_products_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _timings(monkeypatch, faster_at={8, 16, 64})
    generator = TextGenerator("text-generation", gpt2_folder(tmp_path))
    with caplog.at_level("INFO", logger="batching"):
        generator.load("cpu")
    assert "layer products (in x out" in caplog.text
    assert "prepacked from 8 rows" in caplog.text and " plain (" not in caplog.text
    fused: Any = generator.decode_batch().fused
    assert fused is not None and fused is generator.decode_batch().fused  # one per model
    assert all(p.min_rows == 8 for layer in fused.products for p in layer)


@pytest.mark.parametrize(("enough_s", "rounds"), [(1e9, packed_products.ROUNDS), (0.0, 1)])
def test_each_size_is_timed_both_ways_in_turn_for_up_to_rounds(
    monkeypatch: pytest.MonkeyPatch, enough_s: float, rounds: int
) -> None:
    """Rounds of both ways in turn at each size; one once a size's timings took ENOUGH_S
    (here 0: at once), so a large layer's milliseconds per product do not hold the start."""
    calls: list[tuple[str, int]] = []

    def timed(run: Any, sample: torch.Tensor) -> float:
        calls.append((run.__name__, int(sample.shape[0])))
        return 1.0

    monkeypatch.setattr(packed_products, "timed", timed)
    monkeypatch.setattr(packed_products, "ENOUGH_S", enough_s)
    product = _layers(1)[0][0]
    product.pack(packed_products.PACKED_FOR)
    assert packed_products._measure(product) == [(1.0, 1.0)] * len(ROWS)
    assert calls == [
        (way, rows) for rows in ROWS for _ in range(rounds) for way in ("prepacked", "plain")
    ]
