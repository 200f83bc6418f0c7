"""The one sampler of every generating path: how a row picks its next token from its logits.

A row's :class:`Sampler` holds the logits processors ``generate`` would run for it with one
beam, in ``generate``'s order: the repetition penalty, then the constraints the model's
generation config puts on every answer (:func:`constraints`), then, when it samples, the
temperature, top-k and top-p warpers. A sampled row draws with its own ``torch.Generator``,
seeded from the request's ``seed`` (or at random), so its text never depends on the rows it
runs with, and instances on other threads never share a random state. A greedy row without
processors is the argmax of its raw logits: the running batch picks all of those at once.

Used by the running batches of both architectures (:mod:`.running`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import Any

import torch
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .constraints import Constraint
from .settings import Settings

__all__ = ["Sampler", "constraints", "first_max", "token_ids"]


class Sampler:
    """One row's way from its logits to its next token.

    :param settings: the row's generation settings.
    :param seed: its request's seed (None: a random one), used when it samples.
    :param constraints: what the model's generation config asks of every answer.
    :param device: where its generator draws.
    """

    __slots__ = ("constraint", "generator", "processors")

    def __init__(
        self,
        settings: Settings,
        seed: int | None,
        constraints: Iterable[LogitsProcessor],
        device: torch.device,
        constraint: Constraint | None = None,
    ) -> None:
        processors = LogitsProcessorList()
        if settings.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(settings.repetition_penalty))
        processors.extend(constraints)
        #: The row's structured-output constraint: its mask applies before the warpers.
        self.constraint = constraint
        if constraint is not None:
            processors.append(constraint)
        self.generator: torch.Generator | None = None
        if settings.do_sample:
            if settings.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(settings.temperature))
            if settings.top_k > 0:
                processors.append(TopKLogitsWarper(settings.top_k))
            if 0.0 < settings.top_p < 1.0:
                processors.append(TopPLogitsWarper(settings.top_p))
            elif settings.top_p <= 0.0:
                # The limit of top_p toward 0: the most likely token alone.
                processors.append(TopKLogitsWarper(1))
            seed = seed if seed is not None else secrets.randbits(63)
            self.generator = torch.Generator(device=device).manual_seed(seed)
        self.processors = processors

    @property
    def greedy(self) -> bool:
        """Whether the next token is the argmax of the raw logits (no processor, no draw)."""
        return self.generator is None and not len(self.processors)

    def pick(self, logits: torch.Tensor, seen: list[int]) -> int | None:
        """The next token from the row's ``logits``; ``seen`` is what the processors read as
        the ids so far (a causal LM's prompt and new tokens; an encoder-decoder's decoder
        ids). None: its constraint allows no token."""
        return self.draw(self.scores(logits, seen))

    def scores(self, logits: torch.Tensor, seen: list[int]) -> torch.Tensor:
        """The scores the row draws from (``[vocab]``): ``logits`` through its processors."""
        scores = logits.float().unsqueeze(0)
        if len(self.processors):
            ids = torch.tensor([seen], dtype=torch.long, device=logits.device)
            scores = self.processors(ids, scores.clone())  # type: ignore[arg-type]
        return scores[0]

    def draw(self, scores: torch.Tensor) -> int | None:
        """The token drawn from ``scores`` (:meth:`scores`), which advances the constraint;
        None: the constraint allows none (the row's dead end)."""
        if self.constraint is not None and not bool(torch.isfinite(scores).any()):
            return None
        if self.generator is None:
            token = first_max(scores.unsqueeze(0))[0]
        else:
            probabilities = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probabilities, 1, generator=self.generator))
        if self.constraint is not None:
            self.constraint.advance(token)
        return token


def first_max(logits: torch.Tensor) -> list[int]:
    """Each row's index of its largest value (``[rows, vocab]``), the first where several
    tie, as ``torch.argmax`` picks (a NaN counts as the largest in both). On the CPU through
    numpy, whose argmax reads rows at memory speed, where torch's was a visible part of a
    large vocabulary's step."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        picked: list[int] = logits.detach().numpy().argmax(axis=-1).tolist()
        return picked
    return [int(token) for token in logits.argmax(dim=-1).tolist()]


def constraints(
    config: Any, eos: Seq[int], device: torch.device, *, start: int, max_new_tokens: int
) -> list[LogitsProcessor]:
    """The generation config's constraints on one row's answer, as ``generate`` builds them
    for one beam: ``min_length``, ``min_new_tokens``, ``no_repeat_ngram_size``,
    ``forced_bos_token_id``, ``forced_eos_token_id`` and ``suppress_tokens``.

    :param config: the model's ``GenerationConfig``.
    :param start: how many ids the row's processors read before its first new token (a
        causal LM's prompt; an encoder-decoder's decoder start token), which the lengths
        count from.
    """
    ends, where = sorted(eos), str(device)
    found: list[LogitsProcessor] = []
    if config.no_repeat_ngram_size:
        found.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if ends and config.min_length:
        found.append(MinLengthLogitsProcessor(config.min_length, ends, device=where))
    if ends and config.min_new_tokens:
        found.append(MinNewTokensLengthLogitsProcessor(start, config.min_new_tokens, ends, where))
    if config.forced_bos_token_id is not None:
        found.append(ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if config.forced_eos_token_id is not None:
        found.append(
            ForcedEOSTokenLogitsProcessor(
                start + max_new_tokens, token_ids(config.forced_eos_token_id), device=where
            )
        )
    if config.suppress_tokens:
        found.append(SuppressTokensLogitsProcessor(config.suppress_tokens, where))
    return found


def token_ids(value: Any) -> list[int]:
    """A config's token id or ids as a list (none for None)."""
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]
