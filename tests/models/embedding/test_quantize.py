"""Compact encodings: every encoding, with and without ``dimensions``, equal to
sentence-transformers' ``quantize_embeddings`` given the ranges the model calibrated at load;
those ranges equal the ones ``quantize_embeddings`` derives from the calibration texts'
vectors; and ``dimensions`` alone (float) equals ``encode(truncate_dim=...)`` re-normalised."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.util.quantization import quantize_embeddings

from batching.models.embedding.quantize import (
    CALIBRATION_COUNT,
    Calibration,
    calibration_sentences,
    quantize,
)
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.items import EMBEDDING_KEY, EmbedItem
from tests.support.tiny import sentence_folder

TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "red blue green house tree runs fast slow what where who eats fish sleeps the a cat dog",
    "who eats fish",
]
PROMPTS = {"query": "what is ", "passage": "the a "}
PRECISIONS = {"float": "float32", "int8": "int8", "uint8": "uint8", "binary": "binary"}
PRECISIONS["ubinary"] = "ubinary"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quantize")
    return sentence_folder(root, "st", prompts=PROMPTS, default_prompt_name="query")


@pytest.fixture(scope="module")
def model(folder: Path) -> Iterator[SentenceEmbedder]:
    embedder = SentenceEmbedder(folder)
    embedder.load("cpu")
    yield embedder


@pytest.fixture(scope="module")
def reference(folder: Path) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu")


def _ranges(model: SentenceEmbedder) -> np.ndarray:
    return np.array(model.metadata()[EMBEDDING_KEY]["quantization_ranges"], dtype=np.float32)


def test_the_calibration_texts_are_fixed_and_varied() -> None:
    texts = calibration_sentences()
    assert len(texts) == CALIBRATION_COUNT == 128
    assert len(set(texts)) == 128 and texts == calibration_sentences()
    lengths = sorted(len(text.split()) for text in texts)
    assert lengths[0] == 1 and lengths[-1] >= 12


def test_the_ranges_are_those_of_the_calibration_texts_vectors(
    model: SentenceEmbedder, reference: SentenceTransformer
) -> None:
    # Calibrated as plain texts are embedded: with the default prompt.
    vectors = reference.encode(calibration_sentences())
    expected = np.vstack((vectors.min(axis=0), vectors.max(axis=0)))
    np.testing.assert_allclose(_ranges(model), expected, atol=1e-6)
    assert model.metadata()[EMBEDDING_KEY]["calibration_texts"] == 128


@pytest.mark.parametrize("encoding", list(PRECISIONS))
@pytest.mark.parametrize("dimensions", [None, 16, 12])
def test_each_encoding_equals_quantize_embeddings(
    model: SentenceEmbedder,
    reference: SentenceTransformer,
    encoding: str,
    dimensions: int | None,
) -> None:
    def items(encoding: str) -> list[object]:
        return [
            EmbedItem(text, prompt=PROMPTS["passage"], dimensions=dimensions, encoding=encoding)  # type: ignore[arg-type]
            for text in TEXTS
        ]

    floats = np.stack(model.predict(items("float")))
    # The float vectors are encode's, shortened and re-normalised ...
    embeddings = reference.encode(TEXTS, prompt_name="passage", truncate_dim=dimensions)
    if dimensions is not None:
        embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    np.testing.assert_allclose(floats, embeddings, atol=1e-6)
    # ... the ranges for that width are the calibration vectors' (shortened the same way) ...
    ranges = model.quantization_ranges(dimensions)
    assert ranges is not None
    calibration = reference.encode(calibration_sentences(), truncate_dim=dimensions)
    if dimensions is not None:
        calibration = calibration / np.linalg.norm(calibration, axis=1, keepdims=True)
    np.testing.assert_allclose(
        ranges, [calibration.min(axis=0), calibration.max(axis=0)], atol=1e-6
    )
    # ... and the encoded vectors are quantize_embeddings' of them, given those ranges.
    got = np.stack(model.predict(items(encoding)))
    expected = quantize_embeddings(floats, PRECISIONS[encoding], ranges=ranges)  # type: ignore[arg-type]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("encoding", ["int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("dimensions", [None, 20])
def test_quantize_is_quantize_embeddings_given_the_same_ranges(
    encoding: str, dimensions: int | None
) -> None:
    generator = np.random.default_rng(0)
    calibration = Calibration(generator.normal(size=(128, 32)).astype(np.float32), True)
    vectors = generator.normal(size=(9, 32)).astype(np.float32)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    if dimensions is not None:
        vectors = vectors[:, :dimensions] / np.linalg.norm(
            vectors[:, :dimensions], axis=1, keepdims=True
        )
    ranges = calibration.ranges(dimensions)
    assert ranges.shape == (2, dimensions or 32)
    np.testing.assert_array_equal(
        quantize(vectors, encoding, ranges),
        quantize_embeddings(vectors, encoding, ranges=ranges),  # type: ignore[arg-type]
    )
    # One row at a time, as predict quantizes each item.
    np.testing.assert_array_equal(
        np.stack([quantize(row, encoding, ranges) for row in vectors]),
        quantize_embeddings(vectors, encoding, ranges=ranges),  # type: ignore[arg-type]
    )


def test_shorter_ranges_come_from_the_shortened_renormalised_vectors() -> None:
    generator = np.random.default_rng(1)
    vectors = generator.normal(size=(128, 32)).astype(np.float32)
    calibration = Calibration(vectors, normalize=True)
    cut = vectors[:, :8] / np.linalg.norm(vectors[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(calibration.ranges(8), [cut.min(axis=0), cut.max(axis=0)])
    assert calibration.ranges(8) is calibration.ranges(8)  # computed once per width
    raw = Calibration(vectors, normalize=False)
    np.testing.assert_allclose(raw.ranges(8), [vectors[:, :8].min(0), vectors[:, :8].max(0)])


def test_dimensions_keep_the_first_ones_renormalised(
    model: SentenceEmbedder, reference: SentenceTransformer
) -> None:
    outputs = model.predict([EmbedItem(text, dimensions=8) for text in TEXTS])
    full = reference.encode(TEXTS, prompt="")
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(np.stack(outputs), expected, atol=1e-6)
    assert all(output.shape == (8,) and output.dtype == np.float32 for output in outputs)
