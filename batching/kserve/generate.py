"""KServe v2's generate extension as Triton serves it: the body of
``POST /v2/models/{m}/generate`` and ``/generate_stream``, and what they answer (pure).

The body is a JSON object whose keys are the model's inputs (``text_input``) and
``parameters``. The parameters are the task's (``max_new_tokens``, ``temperature``,
``do_sample``, ``top_p``, ``top_k``, ``seed``, ``stop``, ...; ``max_tokens`` is taken as
``max_new_tokens``, as Triton's LLM backends name it); a parameter may also be sent as a key of
its own, as Triton's ensembles take them as inputs. ``stream`` is taken and decided by the
route. Anything else is a 400 naming it. The answer is ``{"model_name", "model_version",
"text_output"}``, with the ``logprobs`` parameter also ``logprobs`` (each token's, and as
many alternatives as asked); a stream sends one such event per piece of text (with the
log-probabilities of the tokens since the last event), and an error after the first byte as
``data: {"error": "..."}``. The structured-output parameters (``json_schema``, ``regex``,
``grammar``) are task parameters like the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batching.codecs.completions import body_object
from batching.errors import InvalidRequest
from batching.models.generation.token_logprobs import TokenLogprob

__all__ = ["LOGPROBS_OUTPUT", "GenerateRequest", "answer", "logprob_entries", "parse_generate"]

#: The output of the tokens' log-probabilities, with the ``logprobs`` parameter.
LOGPROBS_OUTPUT = "logprobs"

#: The input a generate request continues.
TEXT_INPUT = "text_input"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    text: str
    parameters: dict[str, object]


def parse_generate(body: bytes, declared: set[str]) -> GenerateRequest:
    """A generate body; ``declared`` holds the task parameters the model takes.

    :raises InvalidRequest: not a JSON object, no text, or an unknown key.
    """
    parsed = body_object(body)
    text = parsed.pop(TEXT_INPUT, None)
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise InvalidRequest(f"{TEXT_INPUT} must be a string")
    parameters = parsed.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise InvalidRequest("parameters must be an object")
    given: dict[str, object] = {}
    for source in (parsed, parameters):
        for key, value in source.items():
            name = "max_new_tokens" if key == "max_tokens" else key
            if name == "stream":
                continue
            if name == "return_full_text":
                raise InvalidRequest(
                    "return_full_text: generate answers the completion alone (use the infer "
                    "endpoint for the prompt and completion together)"
                )
            if source is parsed and name not in declared:
                raise InvalidRequest(f"unknown input {key!r}: this model takes {TEXT_INPUT}")
            given[name] = value
    return GenerateRequest(text, given)


def answer(
    model: str, version: str, text: str, logprobs: Sequence[TokenLogprob] | None = None
) -> dict[str, object]:
    """The answer (or one streamed event) carrying ``text``, and with the ``logprobs``
    parameter its tokens' log-probabilities (:func:`logprob_entries`)."""
    made: dict[str, object] = {"model_name": model, "model_version": version, "text_output": text}
    if logprobs is not None:
        made[LOGPROBS_OUTPUT] = logprob_entries(logprobs)
    return made


def logprob_entries(entries: Sequence[TokenLogprob]) -> list[dict[str, object]]:
    """Tokens' log-probabilities as the generate extension and the gRPC stream send them
    (the ``logprobs`` output): ``[{"token", "logprob", "top_logprobs": [{"token",
    "logprob"}]}]``, one per token, in order."""
    return [
        {
            "token": entry.token,
            "logprob": entry.logprob,
            "top_logprobs": [{"token": text, "logprob": value} for text, value in entry.top],
        }
        for entry in entries
    ]
