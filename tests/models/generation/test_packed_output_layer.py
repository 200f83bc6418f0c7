"""A generating model's output layer served from a oneDNN-prepacked copy where that measures
faster (``batching.models.generation.packed_products.pack_output_layer``, by the rule the
layers' products follow): the same tokens and logits as plain ``linear``, the decision logged
from what was measured, each row count the way it measured faster, small layers left alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

from batching.models.generation import packed_products, prepacked

Timings = Callable[[list[tuple[float, float]]], None]


def gpt2(vocab: int, width: int) -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=64, n_embd=width, n_layer=1, n_head=2
    )
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch) -> Timings:
    """Sets what timing a product measures at each of ``ROWS`` row counts (prepacked,
    plain): the decision is the test's, not the machine's."""

    def set_timings(times: list[tuple[float, float]]) -> None:
        monkeypatch.setattr(packed_products, "_measure", lambda product: list(times))

    return set_timings


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts oneDNN's prepacked product is given, in order."""
    counts: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x: torch.Tensor, *args: Any) -> torch.Tensor:
        counts.append(int(x.shape[0]))
        return real(x, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    return counts


FASTER = [(1e-3, 2e-3)] * len(packed_products.ROWS)
SLOWER = [(2e-3, 1e-3)] * len(packed_products.ROWS)


def test_a_large_output_layer_served_prepacked_gives_the_same_tokens_and_logits(
    timings: Timings,
) -> None:
    model = gpt2(vocab=8192, width=256)
    reference = gpt2(vocab=8192, width=256)
    timings(FASTER)
    decided = packed_products.pack_output_layer(model)
    assert decided is not None and "served prepacked for oneDNN from 1 rows" in decided
    assert "1: 1000/2000" in decided  # microseconds prepacked/plain, per row count
    head = model.get_output_embeddings()
    assert "forward" in vars(head)  # this layer's own forward, the class's left alone
    assert head.weight is model.transformer.wte.weight  # still tied: other paths read it
    ids = torch.tensor([[5, 17, 300, 4000, 12]])
    with torch.inference_mode():
        ours = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        theirs = reference.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert ours.tolist() == theirs.tolist()
        logits = model(ours).logits
        expected = reference(ours).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_a_prepacked_layer_that_measures_no_faster_is_left_plain(timings: Timings) -> None:
    model = gpt2(vocab=8192, width=256)
    timings(SLOWER)
    decided = packed_products.pack_output_layer(model)
    assert decided is not None and decided.startswith("output layer left plain")
    assert "forward" not in vars(model.get_output_embeddings())


def test_the_output_layer_serves_prepacked_only_from_the_rows_where_it_measured_faster(
    timings: Timings, seen: list[int]
) -> None:
    """The layers' products' rule: from the fewest rows at which the prepacked product was
    faster at that size and every larger one; plain below."""
    model = gpt2(vocab=8192, width=256)
    # Slower at 1, 2 and 4 rows, faster from 8 on.
    timings([SLOWER[0]] * 3 + [FASTER[0]] * (len(packed_products.ROWS) - 3))
    decided = packed_products.pack_output_layer(model)
    assert decided is not None and "from 8 rows" in decided
    head = model.get_output_embeddings()
    with torch.inference_mode():
        for rows in (1, 4, 8, 16):
            hidden = torch.randn(rows, 1, 256)
            expected = torch.nn.functional.linear(hidden, head.weight)
            torch.testing.assert_close(head(hidden), expected, rtol=1e-4, atol=1e-4)
    assert seen == [8, 16]


def test_a_small_output_layer_is_not_a_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    def measured(product: Any) -> list[tuple[float, float]]:
        raise AssertionError("a small output layer is not timed")

    monkeypatch.setattr(packed_products, "_measure", measured)
    model = gpt2(vocab=1000, width=64)
    assert packed_products.pack_output_layer(model) is None
    assert "forward" not in vars(model.get_output_embeddings())


def test_a_text_generator_logs_its_output_layers_decision(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, timings: Timings
) -> None:
    from batching.models.generation.causal import TextGenerator
    from tests.support.generators import gpt2_folder

    timings(SLOWER)
    folder = gpt2_folder(tmp_path)
    small = TextGenerator("text-generation", folder)
    with caplog.at_level("INFO", logger="batching"):
        small.load("cpu")
    # The suite's tiny GPT-2 has a small output layer: left as it is, nothing logged of it.
    assert "output layer" not in caplog.text
    assert "forward" not in vars(small._model.get_output_embeddings())
    # One with a large one: its decision is logged.
    config = transformers.GPT2Config.from_pretrained(folder)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(**{**config.to_dict(), "vocab_size": 8192, "n_embd": 256})
    )
    model.save_pretrained(folder)
    timings(FASTER)
    caplog.clear()
    with caplog.at_level("INFO", logger="batching"):
        TextGenerator("text-generation", folder).load("cpu")
    assert "output layer served prepacked for oneDNN from 1 rows" in caplog.text


def test_many_rows_take_the_plain_product_and_few_are_padded(
    timings: Timings, seen: list[int]
) -> None:
    """oneDNN keeps a kernel per row count it meets: a prompt's every position (its
    log-probabilities) goes plain, a step's rows reach it padded to multiples of ROW_STEP."""
    model = gpt2(vocab=8192, width=256)
    timings(FASTER)
    assert "served prepacked" in (packed_products.pack_output_layer(model) or "")
    head = model.get_output_embeddings()
    with torch.inference_mode():
        for shape in ((3, 1, 256), (16, 1, 256), (2, 40, 256)):
            hidden = torch.randn(*shape)
            expected = torch.nn.functional.linear(hidden, head.weight)
            torch.testing.assert_close(head(hidden), expected, rtol=1e-4, atol=1e-4)
    assert seen == [prepacked.ROW_STEP, 16]  # 3 rows padded to 8; 80 rows plain
