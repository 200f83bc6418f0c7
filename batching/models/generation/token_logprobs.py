"""A generated token's log-probability and its most likely alternatives, and a prompt echoed
with its own (what the OpenAI doors' ``logprobs``, ``top_logprobs`` and ``echo`` answer, and
the KServe ``logprobs`` output). Pure data: no torch.

The log-probabilities are those of the distribution the token was drawn from ("processed",
as vLLM names it): the model's logits after the repetition penalty, the generation config's
constraints, a structured-output mask, and when sampling the temperature, top-k and top-p;
a greedy row without any of these reads the raw logits' log-softmax. A token those rules
exclude has probability 0: its log-probability is reported as :data:`FLOOR` (JSON has no
minus infinity).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tasks.generation import MAX_TOP_LOGPROBS

__all__ = ["FLOOR", "MAX_TOP_LOGPROBS", "Echo", "TokenLogprob"]

#: The log-probability reported for a token of probability 0 (vLLM's choice too).
FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token: its text (the token decoded alone; a special token's, such as the end
    token's, is empty), its log-probability, and the ``top``
    most likely tokens at its place, most likely first, as ``(text, logprob)``."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Echo:
    """A prompt as the model read it, for ``echo``: its text and, when asked, each token's
    log-probability (the first token has none: nothing comes before it)."""

    text: str
    tokens: tuple[str, ...] = ()
    logprobs: tuple[TokenLogprob | None, ...] | None = None
