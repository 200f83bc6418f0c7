"""The running batch of an encoder-decoder (summarization, translation, text2text-generation):
the caches of the rows that :class:`~.running.RunningBatchBase` joins, steps and lets leave,
as :mod:`.causal_batch` holds a causal LM's. transformers' own ``EncoderDecoderCache`` holds them:

- **join**: the newcomers of a turn are encoded together, right-padded to the longest input
  under an encoder attention mask (each row's encoder output is what it is alone), and their
  decoder's first forward (the model's decoder start token) fills their self-attention and
  cross-attention rows and picks their first tokens. Their encoder output and cross-attention
  rows join the batch's padded on the right to the longest input, under the encoder mask;
  their self-attention rows are left-padded to the batch's decoder length, under the decoder
  attention mask;
- **step**: one decoder forward of the last token of every running row. A decoder whose
  positions are relative (T5) needs nothing more: left padding shifts a row's queries and
  keys alike. A decoder with absolute position embeddings (BART, mBART, Marian, Pegasus)
  gets each row's own position (its real tokens so far) for that forward, through a hook on
  its position embedding module (checked once per batch: a lone row decodes the same with the
  hook and without); a decoder of another kind (M2M100's, FSMT's) is refused, and the model
  with it at load;
- **leave**: a finished row's self- and cross-attention rows go (``batch_select_indices``),
  and columns that are padding for every remaining row are cut, on both caches.

Each row's token is picked as ``generate`` picks it with one beam (:mod:`.sampling`, with the
constraints of the model's generation config that do not need beams). Greedy answers then
equal ``model.generate(..., num_beams=1)``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, cast

import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from .causal_batch import cache_layers, check_cache
from .pieces import Answer
from .running import Prompt, Row, RunningBatchBase, pad
from .sampling import token_ids

__all__ = ["Seq2SeqDecodeBatch", "check_decoder"]

#: What a prefill hands the batch: the newcomers' caches, encoder outputs and encoder masks.
_Joined = tuple[EncoderDecoderCache, torch.Tensor, torch.Tensor]


class Seq2SeqDecodeBatch(RunningBatchBase[_Joined]):
    """The running batch of one encoder-decoder instance: its rows, their caches and
    attention masks.

    :param model: the loaded transformers encoder-decoder (``AutoModelForSeq2SeqLM``).
    :param tokenizer: its tokenizer.
    :param prepare: turns a request's item into a :class:`~.generator.Prompt` (tokenise,
        task prefix, truncate or refuse).
    :param answer: a finished row's answer to its whole item.
    """

    cache: EncoderDecoderCache | None
    #: The encoder's output ([rows, inputs, hidden]) and its mask ([rows, inputs], 1 = real).
    states: torch.Tensor | None
    inputs: torch.Tensor | None

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prepare: Callable[[int, Any], Prompt] | None = None,
        answer: Callable[[Prompt, list[int]], Answer] | None = None,
    ) -> None:
        config = model.generation_config
        eos = token_ids(config.eos_token_id) or token_ids(getattr(tokenizer, "eos_token_id", None))
        super().__init__(model, tokenizer, eos, prepare, answer)
        start = config.decoder_start_token_id
        if start is None:
            start = getattr(model.config, "decoder_start_token_id", None)
        if not isinstance(start, int):
            raise NotImplementedError("its generation config names no decoder start token")
        self.start = start
        self.positions = check_decoder(model)
        self._check_positions()

    @property
    def input_columns(self) -> int:
        """The encoder output's columns (the longest running input)."""
        return 0 if self.inputs is None else int(self.inputs.shape[1])

    def prefix_of(self, prompt: Prompt) -> list[int]:
        return [self.start]

    # -- join -------------------------------------------------------------------------------

    def _prefill(self, rows: list[Row]) -> tuple[torch.Tensor, _Joined]:
        """The newcomers' encoder and their decoder's first step, in one forward each."""
        width = max(len(row.prompt.ids) for row in rows)
        ids = [r.prompt.ids + [self.pad] * (width - len(r.prompt.ids)) for r in rows]
        real = [[1] * len(r.prompt.ids) + [0] * (width - len(r.prompt.ids)) for r in rows]
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        inputs = torch.tensor(real, dtype=torch.long, device=self.device)
        starts = torch.full((len(rows), 1), self.start, dtype=torch.long, device=self.device)
        cache = EncoderDecoderCache(
            DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)
        )

        def forward() -> tuple[torch.Tensor, Any]:
            with torch.inference_mode():
                encoded = self.model.get_encoder()(input_ids=input_ids, attention_mask=inputs)
                states = encoded.last_hidden_state
                output = self.model(
                    encoder_outputs=BaseModelOutput(last_hidden_state=states),
                    attention_mask=inputs,
                    decoder_input_ids=starts,
                    cache=cache,
                    use_cache=True,
                )
            return states, output

        states, output = self.threads.run(
            self.threads.prefills, len(rows), int(inputs.numel()), forward
        )
        return output.logits[:, -1], (cache, states, inputs)

    def _append(self, rows: list[Row], joined: _Joined) -> None:
        cache, states, inputs = joined
        mask = torch.ones((len(rows), 1), dtype=torch.long, device=self.device)
        if (
            self.cache is None
            or self.mask is None
            or self.states is None
            or self.inputs is None
            or not self.rows
        ):
            self.cache, self.mask, self.states, self.inputs = cache, mask, states, inputs
            self.rows = list(rows)
            return
        width = max(self.columns, 1)
        for mine, theirs in _pairs(self.cache.self_attention_cache, cache.self_attention_cache):
            mine.keys = torch.cat([pad(mine.keys, width, 2), pad(theirs.keys, width, 2)])
            mine.values = torch.cat([pad(mine.values, width, 2), pad(theirs.values, width, 2)])
        self.mask = torch.cat([pad(self.mask, width, 1), pad(mask, width, 1)])
        length = max(self.input_columns, int(inputs.shape[1]))
        for mine, theirs in _pairs(self.cache.cross_attention_cache, cache.cross_attention_cache):
            mine.keys = _right(mine.keys, theirs.keys, length, 2)
            mine.values = _right(mine.values, theirs.values, length, 2)
        self.states = _right(self.states, states, length, 1)
        self.inputs = _right(self.inputs, inputs, length, 1)
        self.rows.extend(rows)

    # -- step -------------------------------------------------------------------------------

    def _forward(self, last: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        assert self.mask is not None and self.states is not None
        with torch.inference_mode(), self._positions_of(self.mask.sum(dim=1)):
            output = self.model(
                encoder_outputs=BaseModelOutput(last_hidden_state=self.states),
                attention_mask=self.inputs,
                decoder_input_ids=last,
                decoder_attention_mask=mask,
                cache=self.cache,
                use_cache=True,
            )
        logits: torch.Tensor = output.logits[:, -1]
        return logits

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

    # -- leave ------------------------------------------------------------------------------

    def _reorder(self, gone: list[int]) -> list[int]:
        assert self.cache is not None and self.states is not None and self.inputs is not None
        dropped = set(gone)
        kept = [index for index in range(len(self.rows)) if index not in dropped]
        self.cache.batch_select_indices(torch.tensor(kept, device=self.device))
        self.states, self.inputs = self.states[kept], self.inputs[kept]
        return kept

    def _cut(self, first: int) -> None:
        assert self.cache is not None
        for layer in cache_layers(self.cache.self_attention_cache):
            layer.keys = _cut(layer.keys, first, None)
            layer.values = _cut(layer.values, first, None)

    def _after_leave(self) -> None:
        """Input columns that are padding in every remaining row (on the right) go too."""
        assert self.cache is not None and self.inputs is not None and self.states is not None
        used = self.inputs.any(dim=0).nonzero()
        end = int(used[-1]) + 1 if len(used) else self.input_columns
        if end < self.input_columns:
            self.inputs, self.states = self.inputs[:, :end], self.states[:, :end]
            for layer in cache_layers(self.cache.cross_attention_cache):
                layer.keys = _cut(layer.keys, 0, end)
                layer.values = _cut(layer.values, 0, end)

    def _clear(self) -> None:
        self.cache, self.states, self.inputs = None, None, None


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


def _pairs(mine: Any, theirs: Any) -> Iterator[tuple[Any, Any]]:
    """The layers of two caches side by side (both filled)."""
    for one, other in zip(cache_layers(mine), cache_layers(theirs), strict=True):
        assert one.keys is not None and other.keys is not None
        yield one, other


def _cut(tensor: torch.Tensor | None, start: int, end: int | None) -> torch.Tensor:
    assert tensor is not None
    return tensor[:, :, start:end]


def _right(mine: torch.Tensor, theirs: torch.Tensor, width: int, axis: int) -> torch.Tensor:
    """Two tensors' rows one after the other, each padded on the right to ``width``."""
    return torch.cat([pad(mine, width, axis, left=False), pad(theirs, width, axis, left=False)])
