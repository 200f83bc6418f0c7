"""A row's structured-output constraint in the decode loop: llguidance's matcher for its
grammar (:mod:`.grammars`), as a logits processor of the row's one
:class:`~.sampling.Sampler`. Before each pick the tokens the grammar does not allow next are
masked (their logits set to minus infinity); after it the matcher advances by the token
picked. When the grammar is complete the mask allows only the end token; when it allows no
token at all (a dead end) the row ends (its ``finish_reason`` is ``error``), and the batch
goes on.

llguidance reads the model's tokenizer as bytes: a byte-level BPE or a byte-fallback
tokenizer (GPT-2's, Llama's, Qwen's, T5's sentencepiece with byte fallback...). One it
cannot read makes a constrained request a 400 naming why (:func:`tokenizer_of`); it is
built once per tokenizer, on first use.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from transformers.generation.logits_process import LogitsProcessor

from batching.errors import InvalidRequest

__all__ = ["Constraint", "tokenizer_of"]

_LOCK = threading.Lock()
#: Each transformers tokenizer's llguidance tokenizer (or why there is none), by vocabulary.
_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def tokenizer_of(tokenizer: Any, vocabulary: int, eos: Iterable[int]) -> Any:
    """``tokenizer`` as llguidance reads it, for logits of ``vocabulary`` entries.

    :raises InvalidRequest: llguidance cannot read it (the reason is named).
    """
    with _LOCK:
        known = _TOKENIZERS.setdefault(tokenizer, {})
        if vocabulary not in known:
            known[vocabulary] = _built(tokenizer, vocabulary, sorted(eos))
        found = known[vocabulary]
    if isinstance(found, str):
        raise InvalidRequest(found)
    return found


def _built(tokenizer: Any, vocabulary: int, eos: list[int]) -> Any:
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocabulary, eos_token=eos or None)
    except Exception as exc:  # llguidance names what it cannot read
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return (
            "structured outputs (json_schema, regex, grammar, response_format) need a "
            "byte-level or byte-fallback tokenizer, and this model's "
            f"({type(tokenizer).__name__}) cannot be read as one"
            + (f": {reason}" if reason else "")
        )


class Constraint(LogitsProcessor):
    """One row's grammar: masks its logits before each pick, advanced by each token picked.

    :param tokenizer: from :func:`tokenizer_of`.
    :param grammar: from :func:`~.grammars.grammar_of`.
    """

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        import llguidance

        with warnings.catch_warnings():
            # Its kernel is a torch.jit.script function (deprecated by torch, still fine).
            warnings.simplefilter("ignore", DeprecationWarning)
            import llguidance.torch

        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self.mask = llguidance.torch.allocate_token_bitmask(1, tokenizer.vocab_size)
        self._fill = llguidance.torch.fill_next_token_bitmask
        self._apply = llguidance.torch.apply_token_bitmask_inplace

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.matcher.is_error():
            scores.fill_(float("-inf"))
            return scores
        self._fill(self.matcher, self.mask, 0)
        self._apply(scores, self.mask)
        return scores

    def advance(self, token: int) -> None:
        """The row picked ``token``."""
        self.matcher.consume_token(token)
