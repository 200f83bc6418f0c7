"""Iteration-level decoding of the encoder-decoders: the running batch of a tiny T5 (relative
positions) and a tiny BART (absolute positions, a forced end token): greedy tokens are the
same alone, in a burst of 16 (joining one by one, or prefilled together) and joining a
running batch, and equal ``model.generate``'s; rows that leave free both caches' rows; seeded
sampling and stop strings per row; the forwards run on the thread governor's counts; a Marian
decoder (sinusoidal positions) likewise, and decoders whose positions cannot be set per row
are refused (the model is then refused at load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from batching.models.generation.running import Prompt
from batching.models.generation.seq2seq import Seq2SeqGenerator
from batching.models.generation.seq2seq_batch import Seq2SeqDecodeBatch, check_decoder
from batching.models.generation.settings import Defaults, Settings
from batching.models.parameters import TaskItem
from batching.models.source import ModelSource
from tests.support.generators import bart_folder, seq2seq_reference, t5_folder
from tests.support.running_batches import (
    check_company_free,
    check_seeded_sampling,
    check_stop_string,
    item,
    run,
)

PROMPTS = [
    "the cat sat",
    "a dog",
    "who eats fish on the mat and the red house is green",
    "i like green",
    "sat",
    "the cat runs fast on the mat",
    "green fish",
    "who",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seq2seq-decoding")
    return {"t5": t5_folder(root), "bart": bart_folder(root)}


def loaded(folder: Path, task: str) -> Seq2SeqGenerator:
    model = ModelSource.parse(str(folder), task).build()
    assert isinstance(model, Seq2SeqGenerator)
    model.load("cpu")
    return model


@pytest.fixture(scope="module")
def t5(folders: dict[str, Path]) -> Seq2SeqGenerator:
    return loaded(folders["t5"], "summarization")


@pytest.fixture(scope="module")
def bart(folders: dict[str, Path]) -> Seq2SeqGenerator:
    return loaded(folders["bart"], "text2text-generation")


def direct(folder: Path, ids: list[int], tokens: int) -> list[int]:
    """The new tokens of one unpadded greedy ``generate`` call, as transformers loads the
    folder (the start token left out)."""
    _, model = seq2seq_reference(folder)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            num_beams=1,
            max_new_tokens=tokens,
        )
    return list(out[0, 1:].tolist())


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_greedy_tokens_are_the_same_alone_in_a_burst_and_joining(
    name: str, folders: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    model: Seq2SeqGenerator = request.getfixturevalue(name)
    lengths = [12, 3, 9, 16, 5, 11, 7, 14]
    items = [item(PROMPTS[i % 8], lengths[i % 8] - i // 8) for i in range(16)]
    ids = [model._prepare(0, entry).ids for entry in items]
    expected = [direct(folders[name], ids[i], lengths[i % 8] - i // 8) for i in range(16)]
    # The tiny models answer more than the start token and end token.
    assert sum(len(tokens) for tokens in expected) > 60
    check_company_free(model.decode_batch, items, expected)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_newcomers_prefilled_together_get_the_tokens_they_get_alone(
    name: str, folders: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    model: Seq2SeqGenerator = request.getfixturevalue(name)
    lengths = [12, 3, 9, 16, 5, 11, 7, 14]
    items = [item(PROMPTS[i % 8], lengths[i % 8] - i // 8) for i in range(16)]
    expected = [
        direct(folders[name], model._prepare(0, entry).ids, lengths[i % 8] - i // 8)
        for i, entry in enumerate(items)
    ]
    # A burst of 16 inputs of different lengths in one padded encoder and first step.
    burst = run(model.decode_batch(), {0: list(enumerate(items))}, together=True)
    assert [burst[i] for i in range(16)] == expected
    # Groups joining a running batch whose inputs are shorter or longer than theirs.
    joins: dict[int, list[tuple[int, TaskItem]]] = {}
    for index, entry in enumerate(items):
        joins.setdefault((index * 7) % 11, []).append((index, entry))
    joined = run(model.decode_batch(), joins, together=True)
    assert [joined[i] for i in range(16)] == expected


def test_its_forwards_run_on_the_thread_governors_counts(
    t5: Seq2SeqGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("BATCHING_ADAPTIVE_THREADS", "1")
    before = torch.get_num_threads()
    batch = t5.decode_batch()
    assert not batch.threads.fixed
    run(batch, {0: [(0, item(PROMPTS[0], 4)), (1, item(PROMPTS[1], 4))]}, together=True)
    assert torch.get_num_threads() == before
    for governor in (batch.threads.prefills, batch.threads.steps):
        (learnt,) = governor.describe().values()  # batches of two rows: one size bucket
        assert isinstance(learnt, dict) and learnt["us_per_token"]


def test_the_task_prefix_applies_as_on_the_other_doors(t5: Seq2SeqGenerator) -> None:
    batch = t5.decode_batch()
    pieces = [batch.join_item(0, item(PROMPTS[0], 8))]
    while pieces[-1].finish is None:
        pieces.extend(batch.step())
    assert (
        "".join(piece.text for piece in pieces)
        == (t5.predict([item(PROMPTS[0], 8)])[0]["summary_text"])
    )
    assert pieces[0].prompt_tokens == len(t5._tokenizer("summarize: " + PROMPTS[0])["input_ids"])


def test_rows_that_leave_free_both_caches(bart: Seq2SeqGenerator) -> None:
    batch = bart.decode_batch()
    batch.join_item(0, item(PROMPTS[2], 20))
    batch.step()
    batch.step()
    batch.join_item(1, item(PROMPTS[4], 20))
    wide, inputs = batch.columns, batch.input_columns
    batch.leave({0})
    assert len(batch) == 1
    assert batch.columns < wide  # the older row's decoder columns are gone
    assert batch.input_columns < inputs  # and the long input's encoder columns
    assert batch.cache is not None
    layer: Any = batch.cache.cross_attention_cache.layers[0]
    assert layer.keys.shape[0] == 1 and layer.keys.shape[2] == batch.input_columns
    batch.leave({1})
    assert len(batch) == 0 and batch.cache is None


def test_seeded_sampling_is_the_same_alone_and_in_company(t5: Seq2SeqGenerator) -> None:
    check_seeded_sampling(t5.decode_batch, PROMPTS)


def test_a_stop_string_ends_the_sequence_and_is_not_sent(bart: Seq2SeqGenerator) -> None:
    check_stop_string(bart.decode_batch, PROMPTS[0], 4)


# -- decoders with other position schemes -----------------------------------------------------


def tiny_marian(vocab: int, pad: int, eos: int) -> Any:
    """A Marian (sinusoidal positions, an nn.Embedding of fixed weights) from a config."""
    config = transformers.MarianConfig(
        vocab_size=vocab,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        forced_eos_token_id=eos,
        init_std=0.05,  # its answers then vary with the input and the position
    )
    torch.manual_seed(6)
    return transformers.MarianMTModel(config).eval()


def test_a_marian_decoder_gets_each_rows_position(bart: Seq2SeqGenerator) -> None:
    tokenizer = bart._tokenizer
    model = tiny_marian(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    prompts = []
    for index, text in enumerate(PROMPTS):
        tokens = [25, 3, 18, 11, 22, 6, 14, 19][index]
        settings = Settings.of({"max_new_tokens": tokens}, Defaults())
        prompts.append(Prompt(text, tokenizer(text)["input_ids"], {}, settings))
    expected = []
    for prompt in prompts:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt.ids]),
                do_sample=False,
                num_beams=1,
                max_new_tokens=prompt.settings.max_new_tokens,
            )
        expected.append(out[0, 1:].tolist())
    assert sum(len(tokens) for tokens in expected) > 60
    batch = Seq2SeqDecodeBatch(model, tokenizer)
    assert batch.positions is not None
    got: dict[int, list[int]] = {}
    step, ended = 0, set()
    while len(batch) or step < len(prompts):
        for piece in batch.step():
            got[piece.key].append(piece.token_id)
            if piece.finish:
                ended.add(piece.key)
        if step < len(prompts):
            piece = batch.join(step, prompts[step])
            got[step] = [piece.token_id]
            if piece.finish:
                ended.add(step)
        batch.leave(ended)
        step += 1
    assert [got[i] for i in range(len(prompts))] == expected


def test_a_decoder_whose_positions_cannot_be_set_per_row_is_refused() -> None:
    config = transformers.M2M100Config(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_position_embeddings=32,
    )
    model = transformers.M2M100ForConditionalGeneration(config)
    with pytest.raises(NotImplementedError, match="M2M100SinusoidalPositionalEmbedding"):
        check_decoder(model)


def test_the_generation_configs_constraints_apply_as_in_generate(folders: dict[str, Path]) -> None:
    # As a summarization entry of task_specific_params sets them (t5-small's: min_length 30,
    # no_repeat_ngram_size 3): generate applies them with one beam, and so does a running batch.
    model = loaded(folders["t5"], "summarization")
    model._model.generation_config.update(no_repeat_ngram_size=2, min_length=6)
    items = [item(text, 14) for text in PROMPTS[:4]]
    _, reference = seq2seq_reference(folders["t5"])
    expected = []
    for entry in items:
        ids = model._prepare(0, entry).ids
        with torch.inference_mode():
            out = reference.generate(
                torch.tensor([ids]),
                do_sample=False,
                num_beams=1,
                max_new_tokens=14,
                no_repeat_ngram_size=2,
                min_length=6,
            )
        expected.append(out[0, 1:].tolist())
    assert expected != [direct(folders["t5"], model._prepare(0, e).ids, 14) for e in items]
    joins = {index: [(index, entry)] for index, entry in enumerate(items)}
    got = run(model.decode_batch(), joins)
    assert [got[i] for i in range(len(items))] == expected


def test_a_request_costs_its_input_with_the_task_prefix_and_its_new_tokens(
    t5: Seq2SeqGenerator,
) -> None:
    entry = item(PROMPTS[0], 8)
    assert t5.count_tokens(entry) == len(t5._prepare(0, entry).ids) + 8


def test_a_decoder_whose_positions_count_otherwise_is_refused() -> None:
    # FSMT's position embedding is an nn.Embedding, but it counts from its padding token.
    config = transformers.FSMTConfig(
        langs=["en", "de"],
        src_vocab_size=64,
        tgt_vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_position_embeddings=32,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    model = transformers.FSMTForConditionalGeneration(config).eval()
    with pytest.raises(NotImplementedError, match="not its tokens' count"):
        Seq2SeqDecodeBatch(model, None)
