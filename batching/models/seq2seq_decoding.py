"""Iteration-level decoding for the encoder-decoder tasks (summarization, translation,
text2text-generation): a running batch of sequences that advances one token per step, which
new sequences join and finished ones leave between any two steps, as :mod:`.decoding` does
for a causal LM. transformers' own ``EncoderDecoderCache`` holds each row's cache:

- **join**: a newcomer's encoder runs once, alone (batch 1, no padding), and its decoder's
  first forward (the model's decoder start token) fills its self-attention and
  cross-attention rows and picks its first token. Its encoder output and cross-attention
  rows join the batch's padded on the right to the longest input, under an encoder attention
  mask; its self-attention rows are left-padded to the batch's decoder length, under a
  decoder attention mask;
- **step**: one decoder forward of the last token of every running row. A decoder whose
  positions are relative (T5) needs nothing more: left padding shifts a row's queries and
  keys alike. A decoder with absolute position embeddings (BART, mBART, Marian, Pegasus)
  gets each row's own position (its real tokens so far) for that forward, through a hook on
  its position embedding module (checked once per batch: a lone row decodes the same with the
  hook and without); a decoder of another kind (M2M100's, FSMT's) is refused (the streaming
  doors answer 400 naming why; its whole-batch doors serve it);
- **leave**: a finished row's self- and cross-attention rows go (``batch_select_indices``),
  and columns that are padding for every remaining row are cut, on both caches.

Each row's token is picked as ``generate`` picks it with one beam (:mod:`.picking`), with the
constraints of the model's generation config that do not need beams: ``min_length`` and
``min_new_tokens``, ``no_repeat_ngram_size``, ``forced_bos_token_id``,
``forced_eos_token_id`` and ``suppress_tokens``. Greedy answers then equal
``model.generate(..., num_beams=1)``'s.

Everything here runs on the model's instance thread; the scheduler is
:mod:`batching.runtime.decoding`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, cast

import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.modeling_outputs import BaseModelOutput

from .decoding import cache_layers, check_cache
from .generator import Prompt
from .picking import Sequence, Token, advance, pick, sequence_of

__all__ = ["Seq2SeqDecodeBatch", "check_decoder"]


class Seq2SeqDecodeBatch:
    """The running batch of one encoder-decoder instance: its sequences, their caches and
    attention masks.

    :param model: the loaded transformers encoder-decoder (``AutoModelForSeq2SeqLM``).
    :param tokenizer: its tokenizer.
    :param prepare: turns a request's item into a :class:`~.generator.Prompt` (tokenise,
        task prefix, truncate or refuse).
    """

    def __init__(
        self, model: Any, tokenizer: Any, prepare: Callable[[int, Any], Prompt] | None = None
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.prepare = prepare
        self.device = model.device
        config = model.generation_config
        self.eos = frozenset(
            _ids(config.eos_token_id) or _ids(getattr(tokenizer, "eos_token_id", None))
        )
        start = config.decoder_start_token_id
        if start is None:
            start = getattr(model.config, "decoder_start_token_id", None)
        if not isinstance(start, int):
            raise NotImplementedError("its generation config names no decoder start token")
        self.start = start
        self.positions = check_decoder(model)
        self._check_positions()
        self.rows: list[Sequence] = []
        self.cache: EncoderDecoderCache | None = None
        self.mask: torch.Tensor | None = None  # decoder [rows, columns], 1 = real
        self.states: torch.Tensor | None = None  # encoder output [rows, inputs, hidden]
        self.inputs: torch.Tensor | None = None  # encoder [rows, inputs], 1 = real

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> int:
        """The decoder's cache columns (the longest row's tokens and padding)."""
        return 0 if self.mask is None else int(self.mask.shape[1])

    @property
    def input_columns(self) -> int:
        """The encoder output's columns (the longest running input)."""
        return 0 if self.inputs is None else int(self.inputs.shape[1])

    # -- what generate would ask of each row ------------------------------------------------

    def constraints(self, prompt: Prompt) -> list[LogitsProcessor]:
        """The generation config's constraints on ``prompt``'s answer, as ``generate`` builds
        them for one beam (lengths count the decoder's start token)."""
        config = self.model.generation_config
        eos = sorted(self.eos)
        found: list[LogitsProcessor] = []
        if config.no_repeat_ngram_size:
            found.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
        if eos and config.min_length:
            found.append(MinLengthLogitsProcessor(config.min_length, eos, device=self.device))
        if eos and config.min_new_tokens:
            found.append(
                MinNewTokensLengthLogitsProcessor(1, config.min_new_tokens, eos, self.device)
            )
        if config.forced_bos_token_id is not None:
            found.append(ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
        if config.forced_eos_token_id is not None:
            found.append(
                ForcedEOSTokenLogitsProcessor(
                    1 + prompt.settings.max_new_tokens,
                    _ids(config.forced_eos_token_id),
                    device=self.device,
                )
            )
        if config.suppress_tokens:
            found.append(SuppressTokensLogitsProcessor(config.suppress_tokens, self.device))
        return found

    # -- join -------------------------------------------------------------------------------

    def join_item(self, key: int, item: Any) -> Token:
        """Prepare a request's item (tokenise, truncate or refuse) and :meth:`join` it."""
        if self.prepare is None:
            raise RuntimeError("this batch was built without a way to prepare items")
        return self.join(key, self.prepare(0, item))

    def join(self, key: int, prompt: Prompt) -> Token:
        """Encode ``prompt`` alone, run its decoder's first step, pick its first token and add
        its rows to the batch."""
        sequence = sequence_of(key, prompt, self.device, self.constraints(prompt))
        ids = torch.tensor([prompt.ids], dtype=torch.long, device=self.device)
        inputs = torch.ones_like(ids)
        cache = EncoderDecoderCache(
            DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)
        )
        with torch.inference_mode():
            encoded = self.model.get_encoder()(input_ids=ids, attention_mask=inputs)
            states = encoded.last_hidden_state
            output = self.model(
                encoder_outputs=BaseModelOutput(last_hidden_state=states),
                attention_mask=inputs,
                decoder_input_ids=torch.tensor([[self.start]], device=self.device),
                cache=cache,
                use_cache=True,
            )
        token = pick(sequence, output.logits[0, -1], [self.start])
        self._append(sequence, cache, states, inputs)
        return self._advance(sequence, token)

    def _append(
        self,
        sequence: Sequence,
        cache: EncoderDecoderCache,
        states: torch.Tensor,
        inputs: torch.Tensor,
    ) -> None:
        mask = torch.ones((1, 1), dtype=torch.long, device=self.device)
        if (
            self.cache is None
            or self.mask is None
            or self.states is None
            or self.inputs is None
            or not self.rows
        ):
            self.cache, self.mask, self.states, self.inputs = cache, mask, states, inputs
            self.rows = [sequence]
            return
        width = max(self.columns, 1)
        for mine, theirs in _pairs(self.cache.self_attention_cache, cache.self_attention_cache):
            mine.keys = torch.cat([_pad(mine.keys, width, 2), _pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_pad(mine.values, width, 2), _pad(theirs.values, width, 2)])
        self.mask = torch.cat([_pad(self.mask, width, 1), _pad(mask, width, 1)])
        length = max(self.input_columns, int(inputs.shape[1]))
        for mine, theirs in _pairs(self.cache.cross_attention_cache, cache.cross_attention_cache):
            mine.keys = torch.cat(
                [_pad(mine.keys, length, 2, left=False), _pad(theirs.keys, length, 2, left=False)]
            )
            mine.values = torch.cat(
                [
                    _pad(mine.values, length, 2, left=False),
                    _pad(theirs.values, length, 2, left=False),
                ]
            )
        self.states = torch.cat(
            [_pad(self.states, length, 1, left=False), _pad(states, length, 1, left=False)]
        )
        self.inputs = torch.cat(
            [_pad(self.inputs, length, 1, left=False), _pad(inputs, length, 1, left=False)]
        )
        self.rows.append(sequence)

    # -- step -------------------------------------------------------------------------------

    def step(self) -> list[Token]:
        """One token for every running sequence."""
        if not self.rows or self.cache is None or self.mask is None or self.states is None:
            return []
        last = torch.tensor(
            [[row.new_ids[-1]] for row in self.rows], dtype=torch.long, device=self.device
        )
        positions = self.mask.sum(dim=1)
        mask = torch.cat([self.mask, torch.ones_like(last)], dim=1)
        with torch.inference_mode(), self._positions_of(positions):
            output = self.model(
                encoder_outputs=BaseModelOutput(last_hidden_state=self.states),
                attention_mask=self.inputs,
                decoder_input_ids=last,
                decoder_attention_mask=mask,
                cache=self.cache,
                use_cache=True,
            )
        self.mask = mask
        logits = output.logits[:, -1]
        return [
            self._advance(row, pick(row, logits[index], [self.start, *row.new_ids]))
            for index, row in enumerate(self.rows)
        ]

    @contextmanager
    def _positions_of(self, positions: torch.Tensor) -> Iterator[None]:
        """Within the block, the decoder's absolute position embeddings are each row's own
        ``positions`` (its real tokens so far), not the batch's padded column."""
        embedding = self.positions
        if embedding is None:
            yield
            return
        ids = (positions + getattr(embedding, "offset", 0)).unsqueeze(1)

        def own(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            return nn.Embedding.forward(cast(nn.Embedding, module), ids).to(output.dtype)

        handle = embedding.register_forward_hook(own)
        try:
            yield
        finally:
            handle.remove()

    def _check_positions(self) -> None:
        """Refuse a decoder whose position embedding module does not map a token's position
        to its row as the step's hook does (FSMT's and ProphetNet's count from their padding
        token): a lone row's second token, decoded with the hook and without, must give the
        same logits.

        :raises NotImplementedError: they differ.
        """
        if self.positions is None:
            return
        ids = torch.tensor([[self.start]], dtype=torch.long, device=self.device)
        ones = torch.ones_like(ids)
        logits = []
        for hooked in (False, True):
            cache = EncoderDecoderCache(
                DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)
            )
            with torch.inference_mode():
                states = self.model.get_encoder()(input_ids=ids, attention_mask=ones)
                encoded = BaseModelOutput(last_hidden_state=states.last_hidden_state)
                self.model(
                    encoder_outputs=encoded,
                    attention_mask=ones,
                    decoder_input_ids=ids,
                    cache=cache,
                    use_cache=True,
                )
                with self._positions_of(ones[0]) if hooked else nullcontext():
                    output = self.model(
                        encoder_outputs=encoded,
                        attention_mask=ones,
                        decoder_input_ids=ids,
                        decoder_attention_mask=torch.ones(
                            (1, 2), dtype=torch.long, device=self.device
                        ),
                        cache=cache,
                        use_cache=True,
                    )
            logits.append(output.logits)
        if not torch.equal(logits[0], logits[1]):
            raise NotImplementedError(
                f"its decoder's positions ({type(self.positions).__name__}) are not its "
                "tokens' count, and cannot be set per row of a running batch"
            )

    def _advance(self, sequence: Sequence, token: int) -> Token:
        return advance(sequence, token, self.eos, self.tokenizer)

    # -- leave ------------------------------------------------------------------------------

    def leave(self, keys: set[int]) -> None:
        """Drop the sequences in ``keys`` and their cache rows."""
        if not keys:
            return
        kept = [index for index, row in enumerate(self.rows) if row.key not in keys]
        if len(kept) == len(self.rows):
            return
        self.rows = [self.rows[index] for index in kept]
        if (
            not kept
            or self.cache is None
            or self.mask is None
            or self.states is None
            or self.inputs is None
        ):
            self.rows, self.cache, self.mask, self.states, self.inputs = [], None, None, None, None
            return
        self.cache.batch_select_indices(torch.tensor(kept, device=self.device))
        self.mask, self.states, self.inputs = self.mask[kept], self.states[kept], self.inputs[kept]
        # Decoder columns that are padding in every remaining row (on the left) hold nothing.
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            for layer in cache_layers(self.cache.self_attention_cache):
                layer.keys = _cut(layer.keys, first, None)
                layer.values = _cut(layer.values, first, None)
        # Input columns that are padding in every remaining row (on the right) likewise.
        used = self.inputs.any(dim=0).nonzero()
        end = int(used[-1]) + 1 if len(used) else self.input_columns
        if end < self.input_columns:
            self.inputs, self.states = self.inputs[:, :end], self.states[:, :end]
            for layer in cache_layers(self.cache.cross_attention_cache):
                layer.keys = _cut(layer.keys, 0, end)
                layer.values = _cut(layer.values, 0, end)


def check_decoder(model: Any) -> nn.Embedding | None:
    """The decoder's absolute position embedding module, whose output a step replaces with
    each row's own positions (None: its positions are relative, as T5's are).

    :raises NotImplementedError: a cache or position scheme a running batch cannot join.
    """
    config = model.config
    if not getattr(config, "is_encoder_decoder", False):
        raise NotImplementedError("it is not an encoder-decoder")
    check_cache(config)
    decoder = model.get_decoder()
    embedding = getattr(decoder, "embed_positions", None)
    if isinstance(embedding, nn.Embedding):
        return embedding
    if embedding is None and getattr(config, "relative_attention_num_buckets", None):
        return None
    kind = type(embedding).__name__ if embedding is not None else "no position embedding"
    raise NotImplementedError(
        f"its decoder's positions ({kind}) cannot be set per row of a running batch"
    )


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def _pairs(mine: Any, theirs: Any) -> Iterator[tuple[Any, Any]]:
    """The layers of two caches side by side (both filled)."""
    for one, other in zip(cache_layers(mine), cache_layers(theirs), strict=True):
        assert one.keys is not None and other.keys is not None
        yield one, other


def _cut(tensor: torch.Tensor | None, start: int, end: int | None) -> torch.Tensor:
    assert tensor is not None
    return tensor[:, :, start:end]


def _pad(tensor: torch.Tensor, width: int, axis: int, *, left: bool = True) -> torch.Tensor:
    """``tensor`` padded with zeros to ``width`` along ``axis``, on the left or the right."""
    missing = width - tensor.shape[axis]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    zeros = tensor.new_zeros(shape)
    return torch.cat([zeros, tensor] if left else [tensor, zeros], dim=axis)
