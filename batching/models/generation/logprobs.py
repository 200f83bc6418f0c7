"""Log-probabilities in the decode loop (:mod:`.token_logprobs` says which distribution).

- :func:`token_logprob`: a picked token's, and its ``top`` alternatives, from the scores its
  row's sampler drew from (one vocabulary row: no more memory than the logits it has);
- :func:`prompt_logprobs`: each prompt token's, for ``echo`` with ``logprobs``, from the
  prefill's last hidden states: the output layer runs over :data:`CHUNK` positions at a
  time and only each position's own token and its top alternatives are kept, so a prompt
  never costs its length times the vocabulary. :func:`capture_hidden` takes the hidden
  states a prefill computes anyway (the forward keeps only the last position's logits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from batching.errors import InvalidRequest

from .token_logprobs import FLOOR, Echo, TokenLogprob

__all__ = ["CHUNK", "capture_hidden", "prompt_echo", "prompt_logprobs", "token_logprob"]

#: Prompt positions whose logits are computed at once.
CHUNK = 64


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR


def token_logprob(tokenizer: Any, scores: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under ``scores`` (one row of the vocabulary) and the
    ``top`` most likely tokens', each decoded alone."""
    logs = torch.log_softmax(scores.float(), dim=-1)
    return _entry(tokenizer, logs, token, top)


def _entry(tokenizer: Any, logs: torch.Tensor, token: int, top: int) -> TokenLogprob:
    alternatives: tuple[tuple[str, float], ...] = ()
    if top > 0:
        values, indices = torch.topk(logs, min(top, int(logs.shape[-1])))
        alternatives = tuple(
            (_text(tokenizer, index), _finite(value))
            for value, index in zip(values.tolist(), indices.tolist(), strict=True)
        )
    return TokenLogprob(_text(tokenizer, token), _finite(float(logs[token])), alternatives)


def _text(tokenizer: Any, token: int) -> str:
    """A token's text alone, as the answer's text has it (special tokens, such as the end
    token, are empty)."""
    return str(tokenizer.decode([token], skip_special_tokens=True))


@contextlib.contextmanager
def capture_hidden(model: Any) -> Iterator[list[torch.Tensor]]:
    """Within the block, the last hidden states of the model's forwards (``[rows, columns,
    hidden]``, what its output layer reads) are appended to the list yielded."""
    captured: list[torch.Tensor] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        states = output[0] if isinstance(output, tuple) else output.last_hidden_state
        captured.append(states)

    handle = model.base_model.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def prompt_logprobs(
    model: Any,
    tokenizer: Any,
    hidden: torch.Tensor,
    ids: Sequence[int],
    top: int,
    last_logits: torch.Tensor,
) -> tuple[TokenLogprob | None, ...]:
    """Each of ``ids``' log-probability given the ones before it (the first: None), and its
    ``top`` alternatives, from ``hidden`` (``[len(ids), hidden]``: one row's last hidden
    states, its own positions only).

    :param last_logits: the model's own logits at the last position: the output layer must
        give them again, or the model's logits are not its output layer's alone (a final
        soft-cap, a scale) and prompt log-probabilities are refused.
    :raises InvalidRequest: that check failed.
    """
    head = model.get_output_embeddings()
    entries: list[TokenLogprob | None] = [None]
    with torch.inference_mode():
        again = None if head is None else head(hidden[-1:]).float()[0]
        if again is None or not torch.allclose(again, last_logits.float(), atol=1e-4, rtol=1e-4):
            raise InvalidRequest(
                "echo with logprobs: this model's logits are not its output layer's alone, "
                "so its prompt's log-probabilities are not served"
            )
        for start in range(0, len(ids) - 1, CHUNK):
            end = min(start + CHUNK, len(ids) - 1)
            logs = torch.log_softmax(head(hidden[start:end]).float(), dim=-1)
            for offset in range(end - start):
                entries.append(_entry(tokenizer, logs[offset], ids[start + offset + 1], top))
    return tuple(entries)


def prompt_echo(
    tokenizer: Any, ids: Sequence[int], logprobs: tuple[TokenLogprob | None, ...] | None = None
) -> Echo:
    """The prompt ``ids`` as ``echo`` answers it: its text as the model read it, and with
    ``logprobs`` (:func:`prompt_logprobs`) each token's text."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    if logprobs is None:
        return Echo(text)
    return Echo(text, tuple(_text(tokenizer, token) for token in ids), logprobs)
