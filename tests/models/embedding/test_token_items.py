"""What a sentence embedder does with option items beyond prompts: truncation at the start
(keeping the prompt and the special tokens), ``TokenizeItem`` -> ``Tokens``, ``DecodeItem`` ->
``str``, mixed batches answered item by item, and options it cannot apply refused (422)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from batching.errors import UnprocessableInput
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.items import DecodeItem, EmbedItem, TokenizeItem, Tokens, TokenVectors
from tests.support.tiny import ST_MAX_SEQ, decoder_folder, sentence_folder

PROMPTS = {"query": "what is "}
LONG = " ".join(["the cat sat on the mat", "a dog eats fish", "red blue green house tree"] * 2)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("items")


@pytest.fixture(scope="module")
def folder(root: Path) -> Path:
    return sentence_folder(root, "st", prompts=PROMPTS, default_prompt_name="query")


@pytest.fixture(scope="module")
def model(folder: Path) -> Iterator[SentenceEmbedder]:
    embedder = SentenceEmbedder(folder)
    embedder.load("cpu")
    yield embedder


def _ids(model: SentenceEmbedder, item: EmbedItem) -> list[int]:
    (output,) = model.predict([EmbedItem(**{**_fields(item), "output": "tokens"})])
    assert isinstance(output, TokenVectors)
    return list(output.ids.tolist())


def _fields(item: EmbedItem) -> dict[str, object]:
    return {name: getattr(item, name) for name in EmbedItem.__dataclass_fields__}


def test_left_truncation_keeps_the_end_as_sentence_transformers_with_left_truncation(
    model: SentenceEmbedder, folder: Path
) -> None:
    reference = SentenceTransformer(str(folder), device="cpu")
    reference.tokenizer.truncation_side = "left"
    (vector,) = model.predict([EmbedItem(LONG, truncate_left=True)])
    np.testing.assert_allclose(vector, reference.encode(LONG, prompt=""), atol=1e-6)
    expected = reference.tokenizer(LONG, truncation=True, max_length=ST_MAX_SEQ)["input_ids"]
    assert _ids(model, EmbedItem(LONG, truncate_left=True)) == expected
    # Right truncation (the default) keeps the start instead.
    reference.tokenizer.truncation_side = "right"
    start = reference.tokenizer(LONG, truncation=True, max_length=ST_MAX_SEQ)["input_ids"]
    assert _ids(model, EmbedItem(LONG)) == start != expected


def test_left_truncation_keeps_the_prompt(model: SentenceEmbedder) -> None:
    tokenizer = model._tokenizer
    prompt_ids = tokenizer("what is ", add_special_tokens=False)["input_ids"]
    text_ids = tokenizer(LONG, add_special_tokens=False)["input_ids"]
    kept = ST_MAX_SEQ - 2 - len(prompt_ids)
    expected = [
        tokenizer.cls_token_id,
        *prompt_ids,
        *text_ids[-kept:],
        tokenizer.sep_token_id,
    ]
    assert _ids(model, EmbedItem(LONG, prompt="what is ", truncate_left=True)) == expected
    # A short text is not cut at all.
    short = EmbedItem("a dog", prompt="what is ", truncate_left=True)
    assert _ids(model, short) == tokenizer("what is a dog")["input_ids"]


def test_a_batch_mixing_sides_answers_each_item_as_alone(model: SentenceEmbedder) -> None:
    items = [
        EmbedItem(LONG, truncate_left=True),
        EmbedItem("a dog"),
        EmbedItem(LONG, prompt="what is ", truncate_left=True),
        EmbedItem(LONG),
    ]
    together = model.predict(items)
    for item, output in zip(items, together, strict=True):
        np.testing.assert_allclose(output, model.predict([item])[0], atol=1e-6)


def test_tokenize_gives_ids_texts_special_flags_and_offsets(model: SentenceEmbedder) -> None:
    (tokens,) = model.predict([TokenizeItem("the cat sat", prompt="what is ")])
    assert isinstance(tokens, Tokens)
    tokenizer = model._tokenizer
    assert list(tokens.ids) == tokenizer("what is the cat sat")["input_ids"]
    assert tokens.tokens == ("[CLS]", "what", "is", "the", "cat", "sat", "[SEP]")
    assert tokens.special == (True, False, False, False, False, False, True)
    full = "what is the cat sat"
    for text, special, (start, stop) in zip(
        tokens.tokens, tokens.special, tokens.offsets, strict=True
    ):
        assert special or full[start:stop] == text
    (bare,) = model.predict([TokenizeItem("the cat", add_special_tokens=False)])
    assert bare.tokens == ("the", "cat") and bare.offsets == ((0, 3), (4, 7))


def test_tokenize_on_a_decoder_tokenizer(root: Path) -> None:
    model = SentenceEmbedder(decoder_folder(root, "decoder"))
    model.load("cpu")
    (tokens,) = model.predict([TokenizeItem("the cat", prompt="what is ")])
    assert tokens.tokens == ("what", "is", "the", "cat", "<|endoftext|>")
    assert tokens.special == (False, False, False, False, True)
    assert tokens.offsets[:4] == ((0, 4), (5, 7), (8, 11), (12, 15))


def test_decode_turns_ids_back_into_text(model: SentenceEmbedder) -> None:
    ids = tuple(model._tokenizer("the cat sat")["input_ids"])
    assert model.predict([DecodeItem(ids)]) == ["the cat sat"]
    assert model.predict([DecodeItem(ids, skip_special_tokens=False)]) == [
        "[CLS] the cat sat [SEP]"
    ]
    with pytest.raises(UnprocessableInput, match="outside the vocabulary"):
        model.predict([DecodeItem((1, 10_000))])


def test_a_mixed_batch_returns_one_output_per_item_in_order(model: SentenceEmbedder) -> None:
    outputs = model.predict(
        [
            "a dog",
            TokenizeItem("a dog"),
            EmbedItem("a dog", output="tokens"),
            DecodeItem((6, 8)),
            EmbedItem("a dog", encoding="ubinary"),
        ]
    )
    assert len(outputs) == 5
    np.testing.assert_allclose(outputs[0], model.predict(["a dog"])[0], atol=1e-6)
    assert isinstance(outputs[1], Tokens)
    assert isinstance(outputs[2], TokenVectors) and outputs[2].vectors.shape == (4, 32)
    assert outputs[3] == "a dog"
    assert outputs[4].dtype == np.uint8 and outputs[4].shape == (4,)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (EmbedItem("a", output="sparse"), "dense or tokens"),
        (EmbedItem("a", output="tokens", dimensions=8), "apply to dense vectors only"),
        (EmbedItem("a", output="tokens", encoding="int8"), "apply to dense vectors only"),
        (EmbedItem("a", dimensions=33), "dimensions must be between 1 and 32"),
        (EmbedItem("a", encoding="int4"), "encoding 'int4'"),  # type: ignore[arg-type]
    ],
)
def test_options_the_model_cannot_apply_are_refused(
    model: SentenceEmbedder, item: EmbedItem, message: str
) -> None:
    with pytest.raises(UnprocessableInput, match=message):
        model.predict([item])
