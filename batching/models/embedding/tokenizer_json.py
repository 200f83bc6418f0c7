"""A model folder's ``tokenizer.json`` run by the ``tokenizers`` library directly, without
transformers (whose tokenizers import torch): what a server whose engine is not torch
tokenises with.

:class:`JsonTokenizer` answers the part of a transformers tokenizer's interface this package
calls (``tokenizer(texts, ...)``, ``pad``, ``decode``, ``convert_ids_to_tokens``,
``all_special_ids``, ``len()``, ``model_max_length``, ``mask_token``, ``backend_tokenizer``),
with numpy arrays where transformers would return tensors. The folder's
``tokenizer_config.json`` and ``special_tokens_map.json`` say the padding side, the pad token
and the special tokens, as transformers reads them. Whether it tokenises a folder exactly as
transformers does is checked once, where transformers is at hand (:func:`matches`), and the
answer is kept in the engine cache.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import Encoding, Tokenizer

from ..shared.text_models import NO_LIMIT

if TYPE_CHECKING:  # annotations only: the reference is transformers' tokenizer
    from transformers import PreTrainedTokenizerBase

__all__ = ["FILE", "JsonTokenizer", "matches"]

FILE = "tokenizer.json"

#: The special tokens a tokenizer config names (transformers' SPECIAL_TOKENS_ATTRIBUTES).
_NAMED = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: transformers' ``clean_up_tokenization``: spaces before punctuation and contractions.
_CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def _read(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as handle:
        data: object = json.load(handle)
    return data if isinstance(data, dict) else {}


def _content(token: object) -> str | None:
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return str(token["content"])
    return None


class JsonTokenizer:
    """``folder/tokenizer.json`` with the folder's tokenizer settings.

    :raises FileNotFoundError: the folder has no ``tokenizer.json``.
    """

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        backend = Tokenizer.from_file(str(folder / FILE))
        backend.no_padding()
        backend.no_truncation()
        self.backend_tokenizer = backend
        config = {
            **_read(folder / "special_tokens_map.json"),
            **_read(folder / "tokenizer_config.json"),
        }
        limit = config.get("model_max_length")
        self.model_max_length: int = (
            int(limit) if isinstance(limit, int | float) and 0 < limit < NO_LIMIT else NO_LIMIT
        )
        self.padding_side: str = str(config.get("padding_side") or "right")
        self.truncation_side: str = str(config.get("truncation_side") or "right")
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        named = {name: _content(config.get(name)) for name in _NAMED}
        self.mask_token: str | None = named["mask_token"]
        self.pad_token: str | None = named["pad_token"]
        specials = [token for token in named.values() if token is not None]
        additional = config.get("additional_special_tokens")
        specials += [
            token
            for token in (_content(t) for t in (additional if isinstance(additional, list) else ()))
            if token is not None
        ]
        ids = [backend.token_to_id(token) for token in specials]
        self.all_special_ids: list[int] = sorted({i for i in ids if i is not None})
        pad_id = None if self.pad_token is None else backend.token_to_id(self.pad_token)
        self.pad_token_id: int = 0 if pad_id is None else pad_id
        # Batches are cut at a given length: one configured copy per length, made on first use
        # and never changed after (a tokenizer whose settings change refuses concurrent use).
        self._truncating: dict[int, Tokenizer] = {}

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def _cutting(self, max_length: int) -> Tokenizer:
        backend = self._truncating.get(max_length)
        if backend is None:
            backend = Tokenizer.from_str(self.backend_tokenizer.to_str())
            backend.enable_truncation(max_length, direction=self.truncation_side)
            self._truncating[max_length] = backend
        return backend

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        padding: bool = False,
        truncation: bool = False,
        max_length: int | None = None,
        add_special_tokens: bool = True,
        return_offsets_mapping: bool = False,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> dict[str, Any]:
        """What a transformers tokenizer returns for these arguments: lists for one text
        (``return_tensors`` None), int64 numpy arrays for a batch with ``return_tensors``."""
        if truncation and max_length is None:
            max_length = self.model_max_length
        backend = self._cutting(max_length) if truncation and max_length else self.backend_tokenizer
        if isinstance(text, str):
            pair = text_pair if isinstance(text_pair, str) or text_pair is None else None
            encoding = backend.encode(text, pair, add_special_tokens=add_special_tokens)
            row = self._row(encoding, return_offsets_mapping)
            if return_tensors is None:
                return row
            return self.pad([row], padding=True, return_tensors=return_tensors)
        texts = list(text)
        inputs: list[str] | list[tuple[str, str]] = (
            texts if text_pair is None else list(zip(texts, list(text_pair), strict=True))
        )
        encodings = backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        rows = [self._row(encoding, return_offsets_mapping) for encoding in encodings]
        if padding or return_tensors is not None:
            return self.pad(rows, padding=True, return_tensors=return_tensors)
        return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}

    @staticmethod
    def _row(encoding: Encoding, offsets: bool) -> dict[str, list[int] | list[tuple[int, int]]]:
        row: dict[str, list[int] | list[tuple[int, int]]] = {
            "input_ids": list(encoding.ids),
            "token_type_ids": list(encoding.type_ids),
            "attention_mask": list(encoding.attention_mask),
        }
        if offsets:
            row["offset_mapping"] = list(encoding.offsets)
        return row

    def pad(
        self,
        rows: Sequence[Mapping[str, Sequence[int] | Sequence[tuple[int, int]]]],
        padding: bool = True,
        return_tensors: str | None = "np",
    ) -> dict[str, NDArray[np.int64]]:
        """Rows padded to the longest, on the folder's padding side, as int64 arrays."""
        longest = max((len(row["input_ids"]) for row in rows), default=0)
        fill = {"input_ids": self.pad_token_id, "token_type_ids": 0, "attention_mask": 0}
        out: dict[str, NDArray[np.int64]] = {}
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            array = np.full((len(rows), longest), fill[key], dtype=np.int64)
            for index, row in enumerate(rows):
                values = row.get(key)
                if values is None:
                    values = [1] * len(row["input_ids"]) if key == "attention_mask" else []
                    if key == "token_type_ids":
                        values = [0] * len(row["input_ids"])
                n = len(values)
                if n:
                    if self.padding_side == "left":
                        array[index, longest - n :] = values
                    else:
                        array[index, :n] = values
            out[key] = array
        return out

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        backend = self.backend_tokenizer
        return [backend.id_to_token(int(token)) or "" for token in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = str(
            self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        )
        if self.clean_up_tokenization_spaces:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text


#: Texts that tell tokenizers apart: case, accents, punctuation, digits, CJK, spaces, emoji.
_PROBES = (
    "Hello, World! It's a test.",
    "  leading and   trailing spaces  ",
    "Ünïcödé àccents naïve café",
    "numbers 1234567 and 3.14159, dates 2024-01-02",
    "中文字符和日本語のテキスト",
    "emoji 🙂 and symbols #$%&*()[]{}",
    "don't won't can't I'm you're we've",
    "a " * 300,
)


def matches(folder: Path, reference: PreTrainedTokenizerBase, max_length: int) -> str | None:
    """Whether :class:`JsonTokenizer` tokenises ``folder`` exactly as ``reference`` (the
    transformers tokenizer) does: ids, type ids, masks, padding, offsets, special ids,
    vocabulary size and decoding. None when it does; otherwise what differs."""
    try:
        mine = JsonTokenizer(folder)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    texts = list(_PROBES)

    def differs(*batch: list[str]) -> str | None:
        """The first output (ids, mask, ...) that differs for ``batch`` (texts, or two lists:
        pairs), padded and truncated, or None."""
        theirs = reference(
            *batch, padding=True, truncation=True, max_length=max_length, return_tensors="np"
        )
        ours = mine(
            *batch, padding=True, truncation=True, max_length=max_length, return_tensors="np"
        )
        return next(
            (
                key
                for key in theirs
                if key not in ours or not np.array_equal(np.asarray(theirs[key]), ours[key])
            ),
            None,
        )

    key = differs(texts)
    if key is not None:
        return f"batch {key} differ"
    key = differs(texts[:3], texts[3:6])
    if key is not None:
        return f"pairs' {key} differ"
    for text in texts[:7]:
        a = reference(text, truncation=False, return_offsets_mapping=True, verbose=False)
        b = mine(text, truncation=False, return_offsets_mapping=True)
        if list(a["input_ids"]) != b["input_ids"]:
            return "ids differ"
        if [tuple(o) for o in a["offset_mapping"]] != [tuple(o) for o in b["offset_mapping"]]:
            return "offsets differ"
        for skip in (False, True):
            if reference.decode(b["input_ids"], skip_special_tokens=skip) != mine.decode(
                b["input_ids"], skip_special_tokens=skip
            ):
                return "decoding differs"
    if set(reference.all_special_ids) != set(mine.all_special_ids):
        return "special tokens differ"
    if len(reference) != len(mine) or reference.padding_side != mine.padding_side:
        return "vocabulary size or padding side differ"
    if getattr(reference, "mask_token", None) != mine.mask_token:
        return "mask token differs"
    return None
