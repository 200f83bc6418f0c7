"""A row's text decoded a few tokens at a time equals its tokens decoded whole, on a
byte-level BPE (GPT-2's), a SentencePiece-style tokenizer (a leading-space marker the first
token drops) and one that cleans up spaces (decoded whole)."""

from __future__ import annotations

from typing import Any

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from batching.models.generation.detokenizer import PARTIAL, Decoded, Detokenizer
from tests.support.generators import gpt2_folder
from tests.support.tiny import WORDS

#: Characters of one, two, three and four bytes in UTF-8, so that tokens split them.
TEXTS = [" ".join(WORDS), "ça coûte 5 € — naïve ☕ 🙂 漢字 der Bär", "🙂🙂 ☕☕ ÿ"]


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = gpt2_folder(tmp_path_factory.mktemp("detok"))
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def _metaspace(clean_up: bool) -> Any:
    """A SentencePiece-style tokenizer: words start with "▁", which the decoder turns into a
    space, except at the start of a text."""
    vocab = {"<unk>": 0, "</s>": 1}
    for piece in ["▁", "a", "b", "c", "é", ".", ",", "▁a", "▁b", "▁c", "▁é", "ab", "▁ab", "▁."]:
        vocab.setdefault(piece, len(vocab))
    backend = Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="</s>",
        clean_up_tokenization_spaces=clean_up,
    )


def _stepped(detokenizer: Detokenizer, ids: list[int]) -> list[str]:
    """The text after each new token, as a row's steps ask for it; the last one final."""
    decoded = Decoded()
    return [
        detokenizer.text(ids[:count], decoded, final=count == len(ids))
        for count in range(1, len(ids) + 1)
    ]


def _check(tokenizer: Any, ids: list[int]) -> None:
    texts = _stepped(Detokenizer(tokenizer), ids)
    whole = [
        tokenizer.decode(ids[:count], skip_special_tokens=True) for count in range(1, len(ids) + 1)
    ]
    assert texts[-1] == whole[-1]
    for text, expected in zip(texts[:-1], whole[:-1], strict=True):
        # Before the end, a partial character is left out until its last byte comes.
        assert text == expected.rstrip(PARTIAL) or (
            expected.endswith(PARTIAL) and expected.startswith(text)
        ), (text, expected)


def test_byte_level_text_decodes_a_window_at_a_time(byte_level: Any) -> None:
    assert Detokenizer(byte_level)._window is not None
    for text in TEXTS:
        ids = byte_level(text)["input_ids"]
        _check(byte_level, ids)
        # Each character that is several bytes arrives whole, never as a replacement.
        assert PARTIAL not in "".join(_stepped(Detokenizer(byte_level), ids))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_byte_level_tokens_decode_as_a_whole_decode(byte_level: Any, data: Any) -> None:
    # Any ids at all, the end token among them: invalid byte sequences included.
    ids = data.draw(st.lists(st.integers(0, len(byte_level) - 1), min_size=1, max_size=40))
    _check(byte_level, ids)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_sentencepiece_style_tokens_keep_their_spaces(data: Any) -> None:
    tokenizer = _metaspace(clean_up=False)
    assert Detokenizer(tokenizer)._window is not None
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), min_size=1, max_size=30))
    _check(tokenizer, ids)


def test_a_tokenizer_that_cleans_up_spaces_is_decoded_whole() -> None:
    tokenizer = _metaspace(clean_up=True)
    assert Detokenizer(tokenizer)._window is None
    ids = tokenizer("ab . a , b", add_special_tokens=False)["input_ids"]
    _check(tokenizer, ids)
    assert "<unk>" in tokenizer.decode(ids)  # "," is not in its vocabulary
    text = _stepped(Detokenizer(tokenizer), ids)[-1]
    assert text == tokenizer.decode(ids, skip_special_tokens=True) == "ab. a b"
