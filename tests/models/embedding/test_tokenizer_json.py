"""A folder's tokenizer.json run by the tokenizers library, without transformers: the same
ids, masks, padding side, offsets, special tokens and decoding as transformers' tokenizer, and
a sentence embedder served with it answers every item as one tokenised by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import transformers

from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.embedding.tokenizer_json import JsonTokenizer, matches
from batching.models.engines.engine_options import EngineOptions
from batching.models.items import DecodeItem, EmbedItem, TokenizeItem, TokenVectors
from tests.support.tiny import decoder_folder, sentence_folder

TEXTS = ["the cat sat on the mat", "a dog", "what where who eats fish and sleeps very fast " * 3]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {"st": sentence_folder(root), "decoder": decoder_folder(root)}


@pytest.mark.parametrize("name", ["st", "decoder"])
def test_it_tokenises_as_transformers_does(folders: dict[str, Path], name: str) -> None:
    folder = folders[name]
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert matches(folder, reference, 12) is None
    mine = JsonTokenizer(folder)
    ours = mine(TEXTS, padding=True, truncation=True, max_length=12, return_tensors="np")
    theirs = reference(TEXTS, padding=True, truncation=True, max_length=12, return_tensors="np")
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key])
    assert mine.padding_side == reference.padding_side
    assert sorted(mine.all_special_ids) == sorted(reference.all_special_ids)


def test_a_folder_transformers_reads_differently_is_found_and_named(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "cased"
    folder.mkdir()
    for path in folders["st"].iterdir():
        if path.is_file():
            (folder / path.name).write_bytes(path.read_bytes())
    # transformers rebuilds a BERT normaliser from tokenizer_config.json's do_lower_case;
    # tokenizer.json alone still lower-cases.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["do_lower_case"] = False
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert matches(folder, reference, 12) == "batch input_ids differ"
    (folder / "tokenizer.json").unlink()
    assert matches(folder, reference, 12) is not None


def test_an_embedder_on_tokenizer_json_answers_every_item_alike(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    reference = SentenceEmbedder(folders["st"])  # torch: transformers tokenises
    reference.load("cpu")
    options = EngineOptions("onnxruntime", "fp32", str(tmp_path / "cache"), (1, 4), "tiny")
    model = SentenceEmbedder(folders["st"], engine=options)
    model.load("cpu")
    assert isinstance(model._tokenizer, JsonTokenizer)
    assert not isinstance(reference._tokenizer, JsonTokenizer)
    items = [
        *TEXTS,
        EmbedItem(TEXTS[2], truncate_left=True),
        EmbedItem(TEXTS[0], output="tokens"),
        TokenizeItem(TEXTS[1]),
        DecodeItem((2, 7, 8, 3), skip_special_tokens=False),
    ]
    got, want = model.predict(items), reference.predict(items)
    for ours, theirs in zip(got, want, strict=True):
        if isinstance(theirs, TokenVectors):
            np.testing.assert_array_equal(ours.ids, theirs.ids)
            np.testing.assert_allclose(ours.vectors, theirs.vectors, atol=1e-4)
        elif isinstance(theirs, np.ndarray):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)
        else:
            assert ours == theirs
    assert [model.count_tokens(text) for text in TEXTS] == [
        reference.count_tokens(text) for text in TEXTS
    ]
