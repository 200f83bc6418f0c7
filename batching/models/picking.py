"""What every running batch does with a row's logits, whatever the model's architecture: pick
the next token (greedy, or sampled with the row's own seeded generator after its temperature,
top-k and top-p), and turn the new token into the text it adds (stop strings cut the text and
end the row; text that may be the start of a stop string, or an incomplete character, is held
back until the next tokens say).

Shared by the running batch of a causal LM (:mod:`.decoding`) and of an encoder-decoder
(:mod:`.seq2seq_decoding`); the scheduler above them is :mod:`batching.runtime.decoding`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .generation import Settings
from .generator import Prompt

__all__ = ["Sequence", "Token", "advance", "held_back", "pick", "processors_of", "sequence_of"]


@dataclass(slots=True)
class Sequence:
    """One request's sequence in the running batch."""

    key: int
    prompt: Prompt
    new_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    #: Characters of the completion already handed out.
    sent: int = 0


@dataclass(frozen=True, slots=True)
class Token:
    """What a step did for one sequence: the text it adds (possibly empty, while a character
    or a possible stop string is incomplete), and why it ended (None: it goes on)."""

    key: int
    token_id: int
    text: str
    finish: str | None = None
    #: The prompt's tokens, as the model read it (after truncation).
    prompt_tokens: int = 0


def processors_of(
    settings: Settings, constraints: Iterable[LogitsProcessor] = ()
) -> LogitsProcessorList:
    """The logits processors of a row with ``settings``: the repetition penalty, then
    ``constraints`` (what the model's generation config asks of every answer), then, when
    sampling, the temperature, top-k and top-p warpers; in ``generate``'s order."""
    processors = LogitsProcessorList()
    if settings.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(settings.repetition_penalty))
    processors.extend(constraints)
    if settings.do_sample:
        if settings.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_k > 0:
            processors.append(TopKLogitsWarper(settings.top_k))
        if settings.top_p < 1.0:
            processors.append(TopPLogitsWarper(settings.top_p))
    return processors


def sequence_of(
    key: int,
    prompt: Prompt,
    device: torch.device,
    constraints: Iterable[LogitsProcessor] = (),
) -> Sequence:
    """A new row for ``prompt``: its processors and, when it samples, its generator (seeded
    from the request's ``seed``, or at random)."""
    sequence = Sequence(key, prompt, processors=processors_of(prompt.settings, constraints))
    if prompt.settings.do_sample:
        seed = prompt.row.seed if prompt.row.seed is not None else secrets.randbits(63)
        sequence.generator = torch.Generator(device=device).manual_seed(seed)
    return sequence


def pick(sequence: Sequence, logits: torch.Tensor, seen: list[int]) -> int:
    """The next token of ``sequence`` from its row of ``logits``; ``seen`` is what its
    processors read as the ids so far (a causal LM's prompt and new tokens; an
    encoder-decoder's decoder ids)."""
    scores = logits.float().unsqueeze(0)
    if len(sequence.processors):
        ids = torch.tensor([seen], dtype=torch.long, device=logits.device)
        scores = sequence.processors(ids, scores)  # type: ignore[arg-type]
    if sequence.generator is None:
        return int(torch.argmax(scores[0]))
    probabilities = torch.softmax(scores[0], dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=sequence.generator))


def held_back(text: str, stops: Seq[str]) -> int:
    """How many characters at the end of ``text`` may be the start of a stop string (they
    are not handed out until the next tokens say)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def advance(sequence: Sequence, token: int, eos: frozenset[int], tokenizer: Any) -> Token:
    """Record ``token`` for ``sequence``: the text it adds and whether it ended it."""
    sequence.new_ids.append(token)
    settings, stops = sequence.prompt.settings, sequence.prompt.row.stop
    finish: str | None = None
    if token in eos:
        finish = "stop"
    elif len(sequence.new_ids) >= settings.max_new_tokens:
        finish = "length"
    text = tokenizer.decode(sequence.new_ids, skip_special_tokens=True)
    if stops:
        cut = min((i for i in (text.find(s, 0) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            text, finish = text[:cut], "stop"
    if finish is None:
        if text.endswith("\ufffd"):
            # A partial character.
            return Token(sequence.key, token, "", None, len(sequence.prompt.ids))
        text = text[: len(text) - held_back(text, stops)]
    added = text[sequence.sent :]
    sequence.sent = max(sequence.sent, len(text))
    return Token(sequence.key, token, added, finish, len(sequence.prompt.ids))
