"""What the generating tasks share: their request parameters with one model's numbers, and
the settings a row generates with (:class:`Settings`: the request's, the repository's or the
model's defaults). Pure: no torch.

Every generating path runs the iteration-level decode loop (:mod:`.running`): a row's token
is picked by its own sampler (:mod:`.sampling`), so its text never depends on the rows it runs
with; the ``batch_neutral`` parameters (``seed``, ``stop``, ``truncate``, ...) are per row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..parameters import Param, TaskItem
from ..tasks.generation import MAX_STOP_LENGTH, MAX_STOP_STRINGS

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "MAX_NEW_TOKENS_CAP",
    "Defaults",
    "Settings",
    "check_stop",
    "cut_at_stop",
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


class GenerationConfig(Protocol):
    """What :meth:`Defaults.of` reads of a model's ``transformers.GenerationConfig``."""

    max_new_tokens: int | None
    do_sample: bool | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    repetition_penalty: float | None


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
    def of(cls, config: GenerationConfig, max_new_tokens: int | None) -> Defaults:
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
    """The settings a row generates with."""

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
