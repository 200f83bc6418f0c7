"""A generating model's output layer served from a oneDNN-prepacked copy where that measures
faster (batching.models.generation.packed_head): the same tokens and logits as plain
``linear``, the decision logged from what was measured, small layers left alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import transformers

from batching.models.generation import packed_head


def gpt2(vocab: int, width: int) -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=64, n_embd=width, n_layer=1, n_head=2
    )
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The timings ``timed`` returns, in its calls' order (prepacked 1 and 16 rows, then
    plain): the decision is the test's, not the machine's."""
    queue: list[float] = []

    def timed(run: Any, sample: torch.Tensor) -> float:
        run(sample)  # both ways still run
        return queue.pop(0)

    monkeypatch.setattr(packed_head, "timed", timed)
    yield queue


def test_a_large_output_layer_served_prepacked_gives_the_same_tokens_and_logits(
    timings: list[float],
) -> None:
    model = gpt2(vocab=8192, width=256)
    reference = gpt2(vocab=8192, width=256)
    timings.extend([0.001, 0.002, 0.004, 0.008])
    decided = packed_head.pack_output_layer(model)
    assert decided is not None and "served prepacked" in decided
    assert "1.0/2.0 ms prepacked against 4.0/8.0 ms plain" in decided
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


def test_a_prepacked_layer_that_measures_no_faster_is_left_plain(timings: list[float]) -> None:
    model = gpt2(vocab=8192, width=256)
    timings.extend([0.004, 0.008, 0.004, 0.008])
    decided = packed_head.pack_output_layer(model)
    assert decided is not None and decided.startswith("output layer left plain")
    assert "forward" not in vars(model.get_output_embeddings())


def test_a_small_output_layer_is_not_a_candidate(timings: list[float]) -> None:
    model = gpt2(vocab=1000, width=64)
    assert packed_head.pack_output_layer(model) is None
    assert timings == []  # nothing was timed
    assert "forward" not in vars(model.get_output_embeddings())


def test_a_text_generator_logs_its_output_layers_decision(
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
    timings: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batching.models.generation import packed_products
    from batching.models.generation.causal import TextGenerator
    from tests.support.generators import gpt2_folder

    # The layers' products are timed apart (their own test): not from this test's queue.
    monkeypatch.setattr(
        packed_products, "_measure", lambda product: [(2.0, 1.0)] * len(packed_products.ROWS)
    )

    folder = gpt2_folder(tmp_path)

    model = TextGenerator("text-generation", folder)
    with caplog.at_level("INFO", logger="batching"):
        model.load("cpu")
    # The suite's tiny GPT-2 has a small output layer: left as it is, nothing logged of it.
    assert "output layer" not in caplog.text
    assert "forward" not in vars(model._model.get_output_embeddings())


def test_many_rows_take_the_plain_product_and_few_are_padded(
    timings: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN keeps a kernel per row count it meets: a prompt's every position (its
    log-probabilities) goes plain, a step's rows reach it padded to multiples of ROW_STEP."""
    model = gpt2(vocab=8192, width=256)
    timings.extend([0.001, 0.002, 0.004, 0.008])
    assert "served prepacked" in (packed_head.pack_output_layer(model) or "")
    head = model.get_output_embeddings()
    seen: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append(int(x.shape[0]))
        return real(x, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    with torch.inference_mode():
        for shape in ((3, 1, 256), (16, 1, 256), (2, 40, 256)):
            hidden = torch.randn(*shape)
            expected = torch.nn.functional.linear(hidden, head.weight)
            torch.testing.assert_close(head(hidden), expected, rtol=1e-4, atol=1e-4)
    assert seen == [packed_head.ROW_STEP, 16]  # 3 rows padded to 8; 80 rows plain
