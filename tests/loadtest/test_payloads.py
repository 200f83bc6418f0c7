"""``load_test.payloads``: request bodies, their sizes and where their texts come from."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from load_test.payloads import build_payloads, load_texts, make_sentence, parse_range


def test_parse_range() -> None:
    assert parse_range("4") == (4, 4)
    assert parse_range("1-6") == (1, 6)
    for bad in ("0", "6-1", "a", "1-"):
        with pytest.raises(ValueError):
            parse_range(bad)


def test_sentences_have_the_requested_number_of_words() -> None:
    import random

    rng = random.Random(1)
    for words in (1, 5, 40):
        sentence = make_sentence(rng, words)
        assert len(sentence.split()) == words
        assert sentence[0].isupper() and sentence.endswith(".")


@pytest.mark.parametrize("api", ["plain", "json", "v2"])
def test_payload_bodies_decode_to_their_inputs(api: str) -> None:
    items = (1, 1) if api == "plain" else (1, 6)
    payloads = build_payloads(api=api, items=items, words=(3, 8), count=200, seed=5)
    assert len(payloads) == 200
    counts = [p.items for p in payloads.payloads]
    assert min(counts) == items[0] and max(counts) == items[1]
    for payload in payloads.payloads:
        if api == "plain":
            texts = [payload.body.decode()]
        elif api == "json":
            texts = orjson.loads(payload.body)["inputs"]
        else:
            (tensor,) = orjson.loads(payload.body)["inputs"]
            assert tensor["datatype"] == "BYTES"
            assert tensor["shape"] == [payload.items, 1]
            texts = tensor["data"]
        assert len(texts) == payload.items
        assert all(3 <= len(t.split()) <= 8 for t in texts)
    expected_path = "/v2/models/all-MiniLM-L6-v2/infer" if api == "v2" else "/"
    assert payloads.path == expected_path
    again = build_payloads(api=api, items=items, words=(3, 8), count=200, seed=5)
    assert again == payloads


def test_plain_bodies_carry_one_input_only() -> None:
    with pytest.raises(ValueError, match="one input"):
        build_payloads(api="plain", items=(1, 2))


def test_payloads_from_a_file(tmp_path: Path) -> None:
    lines = tmp_path / "inputs.txt"
    lines.write_text("first line\n\nsecond line\nthird\n")
    texts = load_texts(lines)
    assert texts == ["first line", "second line", "third"]
    as_json = tmp_path / "inputs.json"
    as_json.write_bytes(orjson.dumps(["a", "b"]))
    assert load_texts(as_json) == ["a", "b"]
    payloads = build_payloads(api="json", items=(2, 2), texts=texts, count=20)
    for payload in payloads.payloads:
        assert set(orjson.loads(payload.body)["inputs"]) <= set(texts)
