"""A row's text, kept up to date one token at a time.

A row's text is what its tokenizer decodes of its new tokens. Decoding them all again at every
step costs in proportion to the row's length (``benchmarks/decode_profile.py``: 0.48 against
0.30 ms of a 5 ms step for 16 rows of about 100 tokens); here each step decodes only a few
tokens: those since the last complete text, with the ones before them as context (so that a
tokenizer that writes a token differently at the start of a text, such as SentencePiece's
leading space, decodes them as it would in place; a context holds at least one token that is
not skipped as special), and appends the difference.

That equals decoding everything only where decoding is a concatenation: a tokenizer backed by
the ``tokenizers`` library that does not clean up spaces afterwards (transformers'
``clean_up_tokenization_spaces`` rewrites the whole text), and whose class keeps
transformers' own decoding. Any other tokenizer is decoded whole, as before. A window whose
context does not decode to a prefix of the window falls back to the whole decode as well.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Decoded", "Detokenizer"]

#: What a tokenizer writes for bytes that are not a whole character yet.
PARTIAL = "\ufffd"


@dataclass(slots=True)
class Decoded:
    """A row's decoded text so far: ``text`` holds its tokens up to ``read``; the next window
    starts at ``prefix`` (its context: the tokens from ``prefix`` to ``read``)."""

    text: str = ""
    prefix: int = 0
    read: int = 0


class Detokenizer:
    """Decodes rows' new tokens with ``tokenizer`` (a transformers tokenizer); ``whole``:
    decode every text whole, whatever the tokenizer (to compare)."""

    def __init__(self, tokenizer: Any, whole: bool = False) -> None:
        self._tokenizer = tokenizer
        self._window: Callable[..., str] | None = None
        self._specials = frozenset(getattr(tokenizer, "all_special_ids", ()))
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if not whole and backend is not None and _decodes_as_backend(tokenizer):
            self._window = backend.decode

    def text(self, ids: list[int], decoded: Decoded, final: bool) -> str:
        """The text of ``ids`` (a row's new tokens, of which ``decoded`` has seen all but the
        last ones). Text that ends in a partial character keeps its replacement character
        only if ``final``; otherwise it stops before the partial character."""
        window = self._window
        if window is None:
            return self._whole(ids, final)
        start = decoded.prefix
        if start and not any(token not in self._specials for token in ids[start : decoded.read]):
            # A context of skipped tokens only is no context: the window's first token would
            # decode as a text's first. It starts at the last token that is not skipped.
            start = decoded.read - 1
            while start > 0 and ids[start] in self._specials:
                start -= 1
        context = window(ids[start : decoded.read], skip_special_tokens=True)
        fresh = window(ids[start:], skip_special_tokens=True)
        if not fresh.startswith(context):
            return self._whole(ids, final)
        if fresh.endswith(PARTIAL):
            return decoded.text + fresh[len(context) :] if final else decoded.text
        decoded.text += fresh[len(context) :]
        decoded.prefix, decoded.read = decoded.read, len(ids)
        return decoded.text

    def _whole(self, ids: list[int], final: bool) -> str:
        text = str(self._tokenizer.decode(ids, skip_special_tokens=True))
        return text if final or not text.endswith(PARTIAL) else text.rstrip(PARTIAL)


def _decodes_as_backend(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s decode is the ``tokenizers`` library's, untouched: its class
    keeps transformers' decoding and it cleans up no spaces."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # an older transformers: decode whole
        return False
    kind = type(tokenizer)
    return (
        isinstance(tokenizer, TokenizersBackend)
        and kind._decode is TokenizersBackend._decode
        and kind.decode is TokenizersBackend.decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
    )
