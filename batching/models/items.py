"""What a request asks of a text model, item by item, and what comes back: the contract between
the doors (which parse a request's options) and the models (which apply them in ``predict``).

A plain ``str`` item still means "this text, with the model's defaults": the fast path of
every embedding request that sets no option. A request that sets one (a prompt, the
truncation side, per-token or sparse outputs, a compact encoding) sends :class:`EmbedItem`
items instead; ``/tokenize`` and ``/decode`` send :class:`TokenizeItem` and
:class:`DecodeItem` through the same queue, so they are batched, admitted and timed like
everything else. A model says which of these it takes in its metadata (``"embedding"``, see
:data:`EMBEDDING_KEY`); a door never sends an item kind the model did not declare.

Every request item of every door is an :data:`Item`: the one type the batcher, the data plane
and the running batches carry.

Pure data: no torch, no numpy at import (outputs are numpy arrays made by the models).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, Union

from .parameters import TaskItem

__all__ = [
    "ENCODINGS",
    "EMBEDDING_KEY",
    "DecodeItem",
    "EmbedItem",
    "Encoding",
    "Item",
    "Output",
    "SparseVector",
    "TokenVectors",
    "Tokens",
    "TokenizeItem",
    "item_text",
]

if TYPE_CHECKING:  # for annotations only: importing this module imports no numpy
    from numpy import generic
    from numpy.typing import NDArray

    from .chat import Chat

#: What an embedding item asks for: one pooled vector, every token's vector, or a sparse
#: vocabulary-sized vector (SPLADE).
Output = Literal["dense", "tokens", "sparse"]

#: How a dense vector is returned, with sentence-transformers' ``quantize_embeddings``
#: semantics: float32, int8/uint8 scaled into 256 steps between per-dimension ranges
#: calibrated at warm-up, or one bit per dimension (``binary`` as int8 offset by -128,
#: ``ubinary`` as uint8), packed 8 dimensions to a byte. (``base64`` is a wire format of the
#: doors, not an encoding the model applies.)
Encoding = Literal["float", "int8", "uint8", "binary", "ubinary"]
ENCODINGS: tuple[Encoding, ...] = ("float", "int8", "uint8", "binary", "ubinary")

#: The metadata key under which a model describes the options it takes, e.g.
#: ``{"prompts": {"query": "query: "}, "default_prompt_name": "query", "max_seq_length": 512,
#: "outputs": ["dense", "tokens"], "encodings": [...], "tokenize": true, ...}``.
EMBEDDING_KEY = "embedding"


@dataclass(frozen=True, slots=True)
class EmbedItem:
    """One text to embed, with the options its request set.

    :param text: the text as the client sent it.
    :param prompt: prepended to ``text`` before tokenising, as sentence-transformers'
        ``encode(prompt=...)`` does; the door resolves ``prompt_name`` and the model's default
        prompt into it. Its tokens count in usage and in token-aware batching.
    :param truncate_left: cut an over-long text at its start rather than its end.
    :param output: what to return (see :data:`Output`).
    :param dimensions: keep the first N dimensions of a dense vector (re-normalised when the
        model's vectors are unit vectors) before ``encoding`` applies; None keeps them all.
    :param encoding: how a dense vector is returned (see :data:`Encoding`).
    """

    text: str
    prompt: str = ""
    truncate_left: bool = False
    output: Output = "dense"
    dimensions: int | None = None
    encoding: Encoding = "float"


@dataclass(frozen=True, slots=True)
class TokenizeItem:
    """One text to tokenise (``POST /tokenize``): ids, tokens and character offsets.

    :param prompt: prepended as for :class:`EmbedItem`; offsets then count from the start of
        the prompt.
    """

    text: str
    prompt: str = ""
    add_special_tokens: bool = True


@dataclass(frozen=True, slots=True)
class DecodeItem:
    """One sequence of token ids to turn back into text (``POST /decode``)."""

    ids: tuple[int, ...]
    skip_special_tokens: bool = True


@dataclass(frozen=True, slots=True)
class TokenVectors:
    """The output of an ``output="tokens"`` item: every token's vector, with its id.

    ``ids`` is an int64 array ``[t]``, ``vectors`` a float32 array ``[t, dim]``; ``t`` counts
    the tokens the model ran for this text (special tokens included, padding excluded).
    """

    ids: Any
    vectors: Any


@dataclass(frozen=True, slots=True)
class SparseVector:
    """The output of an ``output="sparse"`` item: the non-zero entries of a vocabulary-sized
    vector, ``indices`` int64 ascending and ``values`` float32, each ``[nnz]``; ``tokens``
    the vocabulary entry of each index, when the model knows them."""

    indices: Any
    values: Any
    tokens: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Tokens:
    """The output of a :class:`TokenizeItem`: per token its id, its text, whether it is a
    special token, and its ``[start, stop)`` character offsets in prompt + text."""

    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    special: tuple[bool, ...]
    offsets: tuple[tuple[int, int], ...]


def item_text(item: object) -> str | None:
    """The text a text item tokenises (prompt included), or None for other items."""
    if isinstance(item, str):
        return item
    if isinstance(item, EmbedItem | TokenizeItem):
        return item.prompt + item.text
    return None


#: One request item, whatever the door and the model: a text; a JSON value of a plain body
#: (a number, a row of numbers, an object); a media input's ``bytes``; a numeric tensor's row
#: (a numpy array, or a numpy scalar); a dict of a model's named inputs; a task's input with
#: its parameters (:class:`~batching.models.parameters.TaskItem`); an embedding, tokenize or
#: decode item; a chat's messages (:class:`~batching.models.chat.Chat`). Its containers are
#: read-only (``Sequence``, ``Mapping``), so a list of texts or a dict of bytes is one. The
#: batcher, the data plane and the running batches carry it; a model narrows it to what it
#: takes.
Item: TypeAlias = Union[  # noqa: UP007 (the numpy and chat names exist for the checker only)
    str,
    bytes,
    int,
    float,
    bool,
    None,
    EmbedItem,
    TokenizeItem,
    DecodeItem,
    TaskItem,
    "Chat",
    "NDArray[Any]",
    "generic",
    Sequence["Item"],
    Mapping[str, "Item"],
]
