"""What a model's metadata says, read once per metadata object
(:func:`batching.documents.per_document`)."""

from __future__ import annotations

from collections.abc import Mapping

from batching.codecs.inputs import input_specs
from batching.documents import REMEMBERED, per_document


def test_a_reading_runs_once_per_document_and_again_for_another_document() -> None:
    reads: list[Mapping[str, object]] = []

    @per_document
    def inputs_of(metadata: Mapping[str, object]) -> int:
        reads.append(metadata)
        return len(metadata)

    first = {"inputs": []}
    second = {"inputs": [], "outputs": []}  # a reload brings a new document
    assert [inputs_of(first), inputs_of(first), inputs_of(second), inputs_of(first)] == [1, 1, 2, 1]
    assert reads == [first, second]


def test_a_document_equal_to_a_remembered_one_is_read_for_itself() -> None:
    reads = 0

    @per_document
    def count(metadata: Mapping[str, object]) -> int:
        nonlocal reads
        reads += 1
        return reads

    assert count({"a": 1}) == 1
    assert count({"a": 1}) == 2  # equal, not the same object


def test_past_the_limit_the_oldest_documents_are_read_again() -> None:
    reads = 0

    @per_document
    def count(metadata: Mapping[str, object]) -> int:
        nonlocal reads
        reads += 1
        return reads

    documents = [{"n": n} for n in range(REMEMBERED + 1)]
    for document in documents:
        count(document)
    assert reads == REMEMBERED + 1
    count(documents[0])
    assert reads == REMEMBERED + 2


def test_the_model_input_specs_come_from_the_metadata_they_are_asked_of() -> None:
    text = {"inputs": [{"name": "text", "datatype": "BYTES"}]}
    image = {"inputs": [{"name": "image", "datatype": "BYTES", "content": "image"}]}
    assert [spec.name for spec in input_specs(text)] == ["text"]
    assert [spec.name for spec in input_specs(image)] == ["image"]
    assert input_specs(text) is input_specs(text)
