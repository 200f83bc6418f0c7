"""``/tokenize``, ``/decode``, ``/embed_all`` and the v2 ragged outputs end to end on a tiny
sentence-transformers folder, against the references: the folder's own tokenizer and
``SentenceTransformer.encode(output_value="token_embeddings")``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import transformers
from sentence_transformers import SentenceTransformer

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.threaded import serving_in_thread
from tests.support.tiny import ST_MAX_SEQ, sentence_folder

TEXTS = ["the cat sat on the mat", "a dog", "very good movie i like it a lot"]
PROMPTS = {"query": "query: "}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sentence_folder(tmp_path_factory.mktemp("tiny"), prompts=PROMPTS)


@pytest.fixture(scope="module")
def client(folder: Path) -> Iterator[httpx.Client]:
    config = ModelConfig(name="st", source=str(folder), batching=BatchingConfig(max_batch_size=4))
    with serving_in_thread(create_app(config)) as url, httpx.Client(base_url=url) as served:
        yield served


def test_tokenize_equals_the_tokenizers_ids_and_offsets(client: httpx.Client, folder: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    response = client.post("/tokenize", json={"inputs": TEXTS, "prompt_name": "query"})
    assert response.status_code == 200, response.text
    answer = response.json()
    total = 0
    for text, tokens in zip(TEXTS, answer["tokens"], strict=True):
        expected = tokenizer("query: " + text, return_offsets_mapping=True)
        assert [token["id"] for token in tokens] == expected["input_ids"]
        assert [(t["start"], t["stop"]) for t in tokens] == [
            tuple(pair) for pair in expected["offset_mapping"]
        ]
        assert [t["special"] for t in tokens] == [
            i in tokenizer.all_special_ids for i in expected["input_ids"]
        ]
        total += len(tokens)
    assert answer["usage"]["total_tokens"] == total


def test_decode_equals_the_tokenizers_decode(client: httpx.Client, folder: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    for skip in (True, False):
        response = client.post("/decode", json={"ids": ids, "skip_special_tokens": skip})
        assert response.status_code == 200, response.text
        assert response.json()["texts"] == [
            tokenizer.decode(row, skip_special_tokens=skip) for row in ids
        ]
    outside = client.post("/decode", json={"ids": [len(tokenizer)]})
    assert outside.status_code == 422
    assert f"ids run from 0 to {len(tokenizer) - 1}" in outside.json()["error"]


def test_embed_all_equals_sentence_transformers_token_embeddings(
    client: httpx.Client, folder: Path
) -> None:
    reference = SentenceTransformer(str(folder), device="cpu")
    expected = reference.encode(TEXTS, output_value="token_embeddings", convert_to_numpy=False)
    response = client.post("/embed_all", json={"inputs": TEXTS})
    assert response.status_code == 200, response.text
    answer = response.json()
    tokenizer = reference.tokenizer
    for text, vectors, ids, want in zip(
        TEXTS, answer["embeddings"], answer["ids"], expected, strict=True
    ):
        np.testing.assert_allclose(np.array(vectors), want.numpy(), atol=1e-5)
        assert ids == tokenizer(text, truncation=True, max_length=ST_MAX_SEQ)["input_ids"]
    assert answer["usage"]["total_tokens"] == sum(len(ids) for ids in answer["ids"])


def test_embed_all_without_truncation_names_the_limit(client: httpx.Client) -> None:
    long_text = " ".join(["cat"] * 30)  # 32 tokens with [CLS] and [SEP]
    response = client.post("/embed_all", json={"inputs": long_text, "truncate": False})
    assert response.status_code == 413
    error = response.json()["error"]
    assert "has 32 tokens" in error and f"limit of {ST_MAX_SEQ} tokens" in error


def test_the_v2_ragged_outputs_hold_the_same_vectors(client: httpx.Client, folder: Path) -> None:
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS), 1], "data": TEXTS}],
        "outputs": [{"name": name} for name in ("token_embeddings", "token_ids", "token_counts")],
    }
    response = client.post("/v2/models/st/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = {output["name"]: output for output in response.json()["outputs"]}
    counts = outputs["token_counts"]["data"]
    embed_all = (client.post("/embed_all", json={"inputs": TEXTS})).json()
    assert counts == [len(ids) for ids in embed_all["ids"]]
    assert outputs["token_ids"]["data"] == [i for ids in embed_all["ids"] for i in ids]
    vectors = np.array(outputs["token_embeddings"]["data"]).reshape(
        outputs["token_embeddings"]["shape"]
    )
    np.testing.assert_allclose(
        vectors, np.concatenate([np.array(rows) for rows in embed_all["embeddings"]]), atol=1e-6
    )
    metadata = (client.get("/v2/models/st")).json()
    assert [output["name"] for output in metadata["outputs"]] == ["embedding"]
    shapes = {output["name"]: output["shape"] for output in metadata["per_token_outputs"]}
    assert shapes["token_embeddings"] == [-1, vectors.shape[1]]
