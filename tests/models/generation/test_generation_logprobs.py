"""Log-probabilities in the decode loop, against transformers: greedy tokens and their
log-probabilities equal ``generate(..., output_scores=True, return_dict_in_generate=True)``
(the log-softmax of its scores) within 1e-4, for a causal LM (GPT-2) and two
encoder-decoders (T5, BART); a prompt's log-probabilities (``echo``) equal the log-softmax of
one full forward, alone or prefilled beside a longer prompt; a constrained row that reaches a
dead end ends alone. Tiny models built from configs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from batching.models.engines.engine_options import ADAPTIVE_THREADS_VARIABLE
from batching.models.generation import packed_products
from batching.models.generation.causal import TextGenerator
from batching.models.generation.completion_rule import CompletionRule, with_rule
from batching.models.generation.constraints import Constraint
from batching.models.generation.generator import GenerationModel
from batching.models.generation.pieces import Joining, Piece, Status
from batching.models.generation.token_logprobs import FLOOR
from batching.models.parameters import TaskItem
from batching.models.source import ModelSource
from tests.support.generators import bart_folder, gpt2_folder, t5_folder

TOP = 3
PROMPTS = ["the cat sat on the mat", "a dog", "who eats fish", "i like green"]


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[GenerationModel, Any]]]:
    # Every step on the whole thread budget, as transformers' generate runs: a step the thread
    # governor tried on fewer threads sums in another order, and fp32 logits then differ by
    # about 1e-4, the tolerance compared here.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ADAPTIVE_THREADS_VARIABLE, "0")
        yield _built(tmp_path_factory.mktemp("logprobs"), patch)


def _built(root: Path, patch: pytest.MonkeyPatch) -> dict[str, tuple[GenerationModel, Any]]:
    """The models, the GPT-2 twice: its step's products plain, and prepacked for oneDNN at
    every size (:mod:`batching.models.generation.packed_products`; the timings say so)."""
    built: dict[str, tuple[GenerationModel, Any]] = {}
    for name, folder, task in (
        ("gpt2", gpt2_folder(root), "text-generation"),
        ("gpt2-prepacked", gpt2_folder(root / "prepacked"), "text-generation"),
        ("t5", t5_folder(root), "text2text-generation"),
        ("bart", bart_folder(root), "text2text-generation"),
    ):
        faster = name == "gpt2-prepacked"
        patch.setattr(
            packed_products,
            "_measure",
            lambda product, faster=faster: (
                [(1.0, 2.0) if faster else (2.0, 1.0)] * len(packed_products.ROWS)
            ),
        )
        model = ModelSource.parse(str(folder), task).build()
        assert isinstance(model, GenerationModel)
        model.load("cpu")
        reference = model.auto_class.from_pretrained(str(folder)).eval()
        built[name] = (model, reference)
    return built


def pieces_of(model: GenerationModel, entry: TaskItem) -> list[Piece]:
    batch = model.decode_batch()
    pieces = [batch.join_item(0, entry)]
    while pieces[-1].finish is None:
        pieces.extend(batch.step())
    return pieces


def reference_scores(model: GenerationModel, reference: Any, ids: list[int], tokens: int) -> Any:
    encoder_decoder = reference.config.is_encoder_decoder
    with torch.inference_mode():
        return reference.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            num_beams=1,
            max_new_tokens=tokens,
            output_scores=True,
            return_dict_in_generate=True,
            **({} if encoder_decoder else {"pad_token_id": model._tokenizer.eos_token_id}),
        )


@pytest.mark.parametrize("name", ["gpt2", "gpt2-prepacked", "t5", "bart"])
def test_greedy_tokens_and_their_logprobs_equal_generate_with_output_scores(
    models: dict[str, tuple[GenerationModel, Any]], name: str
) -> None:
    model, reference = models[name]
    if name == "gpt2-prepacked":
        fused: Any = model.decode_batch().fused
        assert all(p.packed is not None for layer in fused.products for p in layer)
    for prompt in PROMPTS:
        entry = TaskItem(prompt, (("logprobs", TOP), ("max_new_tokens", 8)))
        ids = model._prepare(0, entry).ids
        pieces = pieces_of(model, entry)
        out = reference_scores(model, reference, ids, 8)
        start = out.sequences.shape[1] - len(out.scores)
        expected_tokens = out.sequences[0, start:].tolist()
        assert [piece.token_id for piece in pieces] == expected_tokens
        for piece, scores in zip(pieces, out.scores, strict=True):
            logs = torch.log_softmax(scores[0].float(), dim=-1).clamp(min=FLOOR)
            assert piece.logprobs is not None
            assert piece.logprobs.logprob == pytest.approx(float(logs[piece.token_id]), abs=1e-4)
            values = torch.topk(logs, TOP).values.tolist()
            got = [value for _, value in piece.logprobs.top]
            assert got == pytest.approx(values, abs=1e-4)


def test_a_row_without_logprobs_carries_none(
    models: dict[str, tuple[GenerationModel, Any]],
) -> None:
    model, _ = models["gpt2"]
    pieces = pieces_of(model, TaskItem(PROMPTS[0], (("max_new_tokens", 3),)))
    assert all(piece.logprobs is None and piece.echo is None for piece in pieces)


def echoed(prompt: str) -> TaskItem:
    return with_rule(
        TaskItem(prompt, (("logprobs", TOP), ("max_new_tokens", 2))), CompletionRule(echo=True)
    )


def test_a_prompts_logprobs_equal_the_log_softmax_of_one_full_forward(
    models: dict[str, tuple[GenerationModel, Any]],
) -> None:
    model, reference = models["gpt2"]
    assert isinstance(model, TextGenerator)
    for prompt in PROMPTS[:2]:
        ids = model._tokenizer(prompt)["input_ids"]
        with torch.inference_mode():
            logs = torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)
        alone = model.decode_batch().join_item(0, echoed(prompt))
        # Prefilled beside a longer prompt: left-padded, its own positions only.
        together = model.decode_batch().join_items(
            [Joining(0, echoed(prompt)), Joining(1, echoed(PROMPTS[0] + " " + PROMPTS[2]))]
        )[0]
        for piece in (alone, together):
            assert isinstance(piece, Piece)
            assert piece.echo is not None and piece.echo.logprobs is not None
            assert piece.echo.text == prompt
            assert piece.echo.logprobs[0] is None
            assert len(piece.echo.logprobs) == len(ids)
            for place in range(1, len(ids)):
                entry = piece.echo.logprobs[place]
                assert entry is not None
                expected = float(logs[place - 1, ids[place]])
                assert entry.logprob == pytest.approx(expected, abs=1e-4)
                assert entry.top[0][1] == pytest.approx(float(logs[place - 1].max()), abs=1e-4)


def test_echo_without_logprobs_is_the_prompt_alone(
    models: dict[str, tuple[GenerationModel, Any]],
) -> None:
    model, _ = models["gpt2"]
    entry = with_rule(TaskItem("the cat", (("max_new_tokens", 2),)), CompletionRule(echo=True))
    piece = model.decode_batch().join_item(0, entry)
    assert piece.echo is not None
    assert (piece.echo.text, piece.echo.logprobs) == ("the cat", None)


def test_a_constrained_row_at_a_dead_end_ends_alone_and_the_batch_goes_on(
    models: dict[str, tuple[GenerationModel, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = models["gpt2"]

    def nothing_allowed(self: Constraint, ids: Any, scores: torch.Tensor) -> torch.Tensor:
        return scores.fill_(float("-inf"))

    monkeypatch.setattr(Constraint, "__call__", nothing_allowed)
    batch = model.decode_batch()
    dead, free = batch.join_items(
        [
            Joining(0, TaskItem("the cat", (("max_new_tokens", 4), ("regex", "[0-9]+")))),
            Joining(1, TaskItem("a dog", (("max_new_tokens", 4),))),
        ]
    )
    assert isinstance(dead, Piece) and isinstance(free, Piece)
    assert dead.finish is Status.FINISHED_DEAD_END
    assert dead.finish.finish_reason == "error"
    assert free.finish is None
    batch.leave({0})
    pieces = [free]
    while pieces[-1].finish is None:
        pieces.extend(batch.step())
    assert pieces[-1].finish is Status.FINISHED_LENGTH


def test_top_p_zero_samples_the_most_likely_token(
    models: dict[str, tuple[GenerationModel, Any]],
) -> None:
    model, _ = models["gpt2"]
    greedy = pieces_of(model, TaskItem(PROMPTS[1], (("max_new_tokens", 6),)))
    sampled = pieces_of(
        model,
        TaskItem(PROMPTS[1], (("do_sample", True), ("max_new_tokens", 6), ("top_p", 0.0))),
    )
    assert [p.token_id for p in sampled] == [p.token_id for p in greedy]
