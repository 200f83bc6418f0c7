"""What the generating tasks share: their request parameters with one model's numbers, the
settings of one group of rows, and the generation step (one ``generate`` call over a batch of
rows).

The step is the model's own ``generate`` with two additions of ours, both per row, so that a
row's text never depends on the rows it is batched with:

- **sampling** is done by :class:`RowSampler`, a logits processor that draws each row's next
  token with that row's own ``torch.Generator`` (seeded from the request's ``seed``, or at
  random), after the group's temperature, top-k and top-p. ``generate`` itself then runs
  greedy over the processed logits. A seeded request therefore gets the same text alone or in
  any batch, and instances on other threads never share a random state;
- **stop strings** are checked by :class:`StopTexts`, a stopping criterion that ends each row
  when its own generated text holds one of its own stop strings.

Rows share one call where their :class:`Settings` match (``max_new_tokens``, ``do_sample``,
``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``); the ``batch_neutral``
parameters are per row.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import transformers
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

from .parameters import Param, TaskItem
from .tasks.generation import MAX_STOP_LENGTH, MAX_STOP_STRINGS

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "MAX_NEW_TOKENS_CAP",
    "Defaults",
    "Row",
    "RowSampler",
    "Settings",
    "StopTexts",
    "cut_at_stop",
    "generate_rows",
    "generation_params",
    "input_text",
]

#: ``max_new_tokens`` when neither the request, the repository nor the model's generation
#: config sets it.
DEFAULT_MAX_NEW_TOKENS = 64
#: Below this temperature, sampling picks the most likely token.
MIN_TEMPERATURE = 1e-4
#: The most new tokens a request may ask for when the model's positions do not bound it.
MAX_NEW_TOKENS_CAP = 4096


@dataclass(frozen=True, slots=True)
class Defaults:
    """The generation settings a request gets when it sets none: the model's generation
    config, with :data:`DEFAULT_MAX_NEW_TOKENS` where it sets no length."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0

    @classmethod
    def of(cls, config: transformers.GenerationConfig, max_new_tokens: int | None) -> Defaults:
        """The defaults ``config`` (the model's generation config) sets; ``max_new_tokens``
        bounds the length (the model's positions allow no more)."""
        length = config.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
        if max_new_tokens is not None:
            length = min(length, max_new_tokens)
        return cls(
            max_new_tokens=max(1, length),
            do_sample=bool(config.do_sample),
            temperature=float(config.temperature if config.temperature is not None else 1.0),
            top_p=float(config.top_p if config.top_p is not None else 1.0),
            top_k=int(config.top_k or 0),
            repetition_penalty=float(config.repetition_penalty or 1.0),
        )


def generation_params(
    declared: Sequence[Param], defaults: Defaults, max_new_tokens: int
) -> dict[str, Param]:
    """A task's declared parameters (:mod:`batching.models.tasks.generation`) with one
    model's numbers: its defaults, and the most new tokens it may generate."""
    params: dict[str, Param] = {}
    for param in declared:
        if param.name == "max_new_tokens":
            param = replace(param, default=defaults.max_new_tokens, maximum=max_new_tokens)
        elif param.name in Defaults.__dataclass_fields__:
            param = replace(param, default=getattr(defaults, param.name))
        params[param.name] = param
    return params


@dataclass(frozen=True, slots=True)
class Settings:
    """The settings one ``generate`` call runs with (a group of rows)."""

    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float

    @classmethod
    def of(cls, parameters: Mapping[str, Any], defaults: Defaults) -> Settings:
        def get(name: str) -> Any:
            value = parameters.get(name)
            return getattr(defaults, name) if value is None else value

        temperature = float(get("temperature"))
        return cls(
            max_new_tokens=int(get("max_new_tokens")),
            # A temperature of 0 means the most likely token, as in OpenAI's API (and one
            # too small to divide float32 logits by is taken as 0).
            do_sample=bool(get("do_sample")) and temperature >= MIN_TEMPERATURE,
            temperature=temperature,
            top_p=float(get("top_p")),
            top_k=int(get("top_k")),
            repetition_penalty=float(get("repetition_penalty")),
        )


@dataclass(frozen=True, slots=True)
class Row:
    """What one row asks of the step beyond its group's settings."""

    seed: int | None = None
    stop: tuple[str, ...] = ()


def input_text(item: Any) -> tuple[str, dict[str, Any]]:
    """An item's text and its request's parameters (none for a plain text).

    :raises TypeError: the item is not a text.
    """
    parameters: dict[str, Any] = {}
    if isinstance(item, TaskItem):
        parameters = dict(item.parameters)
        item = item.input
    if not isinstance(item, str):
        raise TypeError(f"a generating task takes a text, not {type(item).__name__}")
    return item, parameters


def check_stop(stop: Sequence[str]) -> tuple[str, ...]:
    """``stop`` if a request may give it.

    :raises ValueError: too many strings, an empty one, or one too long.
    """
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"parameter 'stop' takes at most {MAX_STOP_STRINGS} strings")
    if any(not text or len(text) > MAX_STOP_LENGTH for text in stop):
        raise ValueError(
            f"parameter 'stop' takes non-empty strings of at most {MAX_STOP_LENGTH} characters"
        )
    return tuple(stop)


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the first of the ``stop`` strings in it."""
    cut = min((index for index in (text.find(s) for s in stop) if index >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class RowSampler(LogitsProcessor):
    """Draws each row's next token with the row's own generator, after the group's
    temperature, top-k and top-p, and leaves only that token possible; greedy decoding then
    picks it. Rows never share a random state, so a row's draw does not depend on its batch."""

    def __init__(self, settings: Settings, generators: Sequence[torch.Generator]) -> None:
        self.generators = list(generators)
        self.warpers = LogitsProcessorList()
        if settings.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_k > 0:
            self.warpers.append(TopKLogitsWarper(settings.top_k))
        if settings.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(settings.top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        warped = self.warpers(input_ids, scores)
        probabilities = torch.softmax(warped.float(), dim=-1)
        chosen = torch.stack(
            [
                torch.multinomial(probabilities[row], 1, generator=generator)
                for row, generator in enumerate(self.generators)
            ]
        )
        only = torch.full_like(scores, float("-inf"))
        only.scatter_(1, chosen, 0.0)
        return only  # type: ignore[return-value]


class StopTexts(StoppingCriteria):
    """Ends each row once its generated text (from ``offset`` on) holds one of its stop
    strings; rows without any never stop here.

    It is asked after every new token, so a stop string that was not there before can only
    end at the newest token: each row decodes only its last tokens, enough to hold its longest
    stop string (a token is at least a byte, a character at most four), not its whole text.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[tuple[str, ...]], offset: int) -> None:
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.offset = offset
        self.windows = [4 * max((len(s) for s in stop), default=0) + 4 for stop in self.stops]

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        length = input_ids.shape[1]
        done = []
        for row, stop in enumerate(self.stops):
            if not stop:
                done.append(False)
                continue
            start = max(self.offset, length - self.windows[row])
            tail = self.tokenizer.decode(input_ids[row, start:], skip_special_tokens=True)
            done.append(any(s in tail for s in stop))
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


def generate_rows(
    model: Any,
    tokenizer: Any,
    encoded: Mapping[str, torch.Tensor],
    settings: Settings,
    rows: Sequence[Row],
    *,
    offset: int,
    pad_token_id: int,
) -> torch.Tensor:
    """One ``generate`` call over a batch of rows that share ``settings``; the returned
    sequences hold each row's new tokens from ``offset`` on (the padded prompt's length for a
    decoder, 1 for an encoder-decoder's start token).

    Greedy rows run with the model's generation config (beam search where it asks for it);
    sampled rows draw with :class:`RowSampler` (one beam). Call it under
    ``torch.inference_mode()``.
    """
    config = model.generation_config
    kwargs: dict[str, Any] = {
        "max_new_tokens": settings.max_new_tokens,
        "pad_token_id": pad_token_id,
        # Sampling is ours (RowSampler): generate always picks the most likely token.
        "do_sample": False,
        "temperature": None,
        "top_p": None,
        "top_k": None,
        "repetition_penalty": settings.repetition_penalty,
    }
    processors = LogitsProcessorList()
    criteria = StoppingCriteriaList()
    beams = int(config.num_beams or 1)
    if settings.do_sample:
        beams = 1
        generators = [
            torch.Generator(device=model.device).manual_seed(
                row.seed if row.seed is not None else secrets.randbits(63)
            )
            for row in rows
        ]
        processors.append(RowSampler(settings, generators))
    kwargs["num_beams"] = beams
    if beams == 1 and any(row.stop for row in rows):
        criteria.append(StopTexts(tokenizer, [row.stop for row in rows], offset))
    output = model.generate(
        **encoded, logits_processor=processors, stopping_criteria=criteria, **kwargs
    )
    sequences: torch.Tensor = output if isinstance(output, torch.Tensor) else output.sequences
    return sequences
