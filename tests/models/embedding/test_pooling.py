"""Pooling: every mode a sentence-transformers folder declares, with right and left padding and
with prompt tokens left out, equal to sentence-transformers' own ``Pooling`` module; and whole
folders (weightedmean, several modes, a lasttoken decoder embedder padding on the left)
equal to ``SentenceTransformer.encode``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling

from batching.models.embedding.pooling import POOLING_MODES, pool
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.engines.engine_options import EngineOptions
from batching.models.items import EmbedItem, TokenVectors
from tests.support.tiny import decoder_folder, sentence_folder

TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "red blue green house tree runs fast slow what where who eats fish sleeps the a cat dog",
    "who",
]
PROMPTS = {"query": "what is ", "passage": "the a "}


def _batch(left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Four rows of 3, 7, 5 and 1 real tokens, padded to 7 on one side (padding holds noise,
    which no mode may read)."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 7, 6, generator=generator)
    mask = torch.zeros(4, 7, dtype=torch.int64)
    for row, length in enumerate((3, 7, 5, 1)):
        if left:
            mask[row, 7 - length :] = 1
        else:
            mask[row, :length] = 1
    return hidden, mask


@pytest.mark.parametrize("mode", POOLING_MODES)
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("prompt", [0, 2])
def test_each_mode_equals_sentence_transformers_pooling(mode: str, left: bool, prompt: int) -> None:
    hidden, mask = _batch(left)
    reference = Pooling(6, pooling_mode=mode, include_prompt=prompt == 0)
    features = {"token_embeddings": hidden, "attention_mask": mask}
    if prompt:
        features["prompt_length"] = prompt  # type: ignore[assignment]
    expected = reference(features)["sentence_embedding"]
    lengths = torch.full((4,), prompt) if prompt else None
    torch.testing.assert_close(pool(hidden, mask, (mode,), lengths), expected)


def test_the_padding_side_does_not_change_a_rows_vector() -> None:
    # The same real tokens, padded right or left, pool to the same vectors in every mode.
    hidden, right_mask = _batch(left=False)
    left_hidden = torch.zeros_like(hidden)
    left_mask = torch.zeros_like(right_mask)
    for row in range(4):
        length = int(right_mask[row].sum())
        left_hidden[row, 7 - length :] = hidden[row, :length]
        left_mask[row, 7 - length :] = 1
    lengths = torch.tensor([1, 2, 0, 0])
    for mode in POOLING_MODES:
        torch.testing.assert_close(
            pool(hidden, right_mask, (mode,), lengths),
            pool(left_hidden, left_mask, (mode,), lengths),
        )


def test_each_row_leaves_out_its_own_prompt() -> None:
    hidden, mask = _batch(left=True)
    lengths = torch.tensor([0, 3, 1, 0])
    pooled = pool(hidden, mask, ("mean",), lengths)
    for row, skip in enumerate(lengths.tolist()):
        real = hidden[row][mask[row].bool()][skip:]
        torch.testing.assert_close(pooled[row], real.mean(dim=0))


@pytest.mark.parametrize(
    "pooling", ["weightedmean", "lasttoken", ["cls", "max", "mean_sqrt_len_tokens", "weightedmean"]]
)
def test_a_folders_pooling_equals_encode(tmp_path: Path, pooling: str | list[str]) -> None:
    folder = sentence_folder(tmp_path, "st", pooling=pooling, prompts=PROMPTS)
    model = SentenceEmbedder(folder)
    model.load("cpu")
    reference = SentenceTransformer(str(folder), device="cpu")
    np.testing.assert_allclose(model.predict(TEXTS), reference.encode(TEXTS), atol=1e-6)
    outputs = model.predict([EmbedItem(text, prompt=PROMPTS["query"]) for text in TEXTS])
    np.testing.assert_allclose(
        np.stack(outputs), reference.encode(TEXTS, prompt_name="query"), atol=1e-6
    )


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decoder_folder(tmp_path_factory.mktemp("decoder"), prompts=PROMPTS)


def test_a_decoder_embedder_pads_left_and_pools_its_last_token_as_encode(decoder: Path) -> None:
    model = SentenceEmbedder(decoder, engine=EngineOptions(engine="torch", precision="fp32"))
    model.load("cpu")
    reference = SentenceTransformer(str(decoder), device="cpu")
    assert reference.tokenizer.padding_side == "left"
    np.testing.assert_allclose(model.predict(TEXTS), reference.encode(TEXTS), atol=1e-5)
    outputs = model.predict([EmbedItem(text, prompt=PROMPTS["passage"]) for text in TEXTS])
    np.testing.assert_allclose(
        np.stack(outputs), reference.encode(TEXTS, prompt_name="passage"), atol=1e-5
    )
    # One at a time (no padding) gives the same vectors as in a padded batch.
    alone = np.stack([model.predict([text])[0] for text in TEXTS])
    np.testing.assert_allclose(alone, reference.encode(TEXTS), atol=1e-5)


def test_a_decoder_embedder_under_engine_auto_matches_encode(decoder: Path, tmp_path: Path) -> None:
    # auto checks every engine against torch fp32 on left-padded calibration batches; what it
    # keeps must still equal sentence-transformers.
    options = EngineOptions(
        engine="auto", precision="fp32", cache_dir=str(tmp_path), batch_sizes=(1, 4)
    )
    model = SentenceEmbedder(decoder, engine=options)
    model.load("cpu")
    reference = SentenceTransformer(str(decoder), device="cpu")
    np.testing.assert_allclose(model.predict(TEXTS), reference.encode(TEXTS), atol=1e-4)
    # Option items (prompts, left truncation, per-token vectors) run on the same engine and
    # equal torch's.
    torch_model = SentenceEmbedder(decoder, engine=EngineOptions(engine="torch", precision="fp32"))
    torch_model.load("cpu")
    items = [
        EmbedItem(TEXTS[2] * 3, prompt=PROMPTS["query"], truncate_left=True),
        EmbedItem(TEXTS[0], output="tokens"),
        EmbedItem(TEXTS[1], prompt=PROMPTS["passage"], output="tokens"),
    ]
    got, want = model.predict(items), torch_model.predict(items)
    np.testing.assert_allclose(got[0], want[0], atol=1e-4)
    for output, expected in zip(got[1:], want[1:], strict=True):
        assert output.ids.tolist() == expected.ids.tolist()
        np.testing.assert_allclose(output.vectors, expected.vectors, atol=1e-4)


def test_token_vectors_are_the_real_tokens_last_hidden_states(decoder: Path) -> None:
    model = SentenceEmbedder(decoder, engine=EngineOptions(engine="torch", precision="fp32"))
    model.load("cpu")
    encoder = model._load_encoder()
    tokenizer = model._tokenizer
    outputs = model.predict(
        [EmbedItem(text, output="tokens", prompt=PROMPTS["query"]) for text in TEXTS[:2]]
    )
    for text, output in zip(TEXTS[:2], outputs, strict=True):
        assert isinstance(output, TokenVectors)
        encoded = tokenizer(PROMPTS["query"] + text, return_tensors="pt")
        with torch.inference_mode():
            expected = encoder(**encoded).last_hidden_state[0].numpy()
        assert output.ids.dtype == np.int64 and output.vectors.dtype == np.float32
        assert output.ids.tolist() == encoded["input_ids"][0].tolist()  # no padding
        np.testing.assert_allclose(output.vectors, expected, atol=1e-5)
