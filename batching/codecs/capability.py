"""What a text model's ``"embedding"`` metadata says it takes (see
:data:`batching.models.items.EMBEDDING_KEY`): per-token outputs, tokenize and decode items, its
prompts, its length limit and its vocabulary. Pure functions over the metadata dict, shared by
the token doors (``/tokenize``, ``/decode``, ``/embed_all``) and the v2 door's token outputs.
"""

from __future__ import annotations

from collections.abc import Mapping

from batching.core.batching_config import BatchingConfig
from batching.documents import listed
from batching.errors import InvalidRequest
from batching.models.items import EMBEDDING_KEY
from batching.models.protocol import MAX_SEQ_LENGTH_KEY

__all__ = [
    "DEFAULT_PER_TOKEN_CAP",
    "TOKENIZE",
    "TOKENS",
    "capable",
    "embedding_of",
    "max_seq_length",
    "per_token_cap",
    "first_output",
    "resolve_prompt",
    "token_dimension",
    "vocab_size",
]

#: The capabilities a door may ask for: ``tokenize`` (TokenizeItem and DecodeItem) and
#: ``tokens`` (``EmbedItem(output="tokens")``).
TOKENIZE = "tokenize"
TOKENS = "tokens"


def first_output(metadata: Mapping[str, object]) -> Mapping[str, object] | None:
    """The model's first output, as its metadata describes it (None: it describes none)."""
    outputs = listed(metadata.get("outputs"))
    first = outputs[0] if outputs else None
    return first if isinstance(first, Mapping) else None


def embedding_of(metadata: Mapping[str, object]) -> Mapping[str, object]:
    """The model's ``"embedding"`` description; empty when it has none."""
    described = metadata.get(EMBEDDING_KEY)
    return described if isinstance(described, Mapping) else {}


def capable(metadata: Mapping[str, object], capability: str) -> bool:
    """Whether the model declares ``capability`` (:data:`TOKENIZE` or :data:`TOKENS`)."""
    described = embedding_of(metadata)
    if capability == TOKENIZE:
        return described.get("tokenize") is True
    outputs = described.get("outputs")
    return isinstance(outputs, list | tuple) and capability in outputs


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def max_seq_length(metadata: Mapping[str, object]) -> int | None:
    """The tokens the model runs per text at most (special tokens included), if it says: its
    metadata's ``max_seq_length``, else its ``"embedding"`` description's. Every door reads
    the limit here."""
    stated = _positive(metadata.get(MAX_SEQ_LENGTH_KEY))
    return stated if stated is not None else _positive(embedding_of(metadata).get("max_seq_length"))


def vocab_size(metadata: Mapping[str, object]) -> int | None:
    """How many token ids the model's tokenizer knows (ids run from 0 below it), if it says."""
    return _positive(embedding_of(metadata).get("vocab_size"))


def token_dimension(metadata: Mapping[str, object]) -> int | None:
    """The width of one token's vector, if the model says (it may differ from the pooled
    vector's when a projection follows the pooling)."""
    return _positive(embedding_of(metadata).get("token_dimension"))


def resolve_prompt(metadata: Mapping[str, object], prompt_name: str | None, model: str) -> str:
    """The prompt text a request's ``prompt_name`` chooses: that prompt of the model's
    ``prompts``, or its ``default_prompt`` when the request names none.

    :raises InvalidRequest: the model has no prompt of that name.
    """
    described = embedding_of(metadata)
    if prompt_name is None:
        default = described.get("default_prompt")
        return default if isinstance(default, str) else ""
    prompts = described.get("prompts")
    prompts = prompts if isinstance(prompts, Mapping) else {}
    prompt = prompts.get(prompt_name)
    if not isinstance(prompt, str):
        names = ", ".join(repr(name) for name in prompts) or "none"
        raise InvalidRequest(
            f"model {model!r} has no prompt named {prompt_name!r}; its prompts: {names}"
        )
    return prompt


#: The padded tokens a batch holding per-token outputs carries at most when the model has no
#: ``--max-batch-tokens`` (TEI's default ``--max-batch-tokens``): 16384 vectors of 1024 floats
#: are 64 MiB of answer.
DEFAULT_PER_TOKEN_CAP = 16384


def per_token_cap(metadata: Mapping[str, object], batching: BatchingConfig) -> int:
    """The padded tokens (items x longest) a batch holding per-token outputs may carry, since
    its answer grows with them: the model's ``max_batch_tokens`` when set, else the lower of
    ``max_batch_size x max_seq_length`` and :data:`DEFAULT_PER_TOKEN_CAP` (a lone text longer
    than the cap still runs, truncated at the model's limit)."""
    if batching.max_batch_tokens is not None:
        return batching.max_batch_tokens
    longest = max_seq_length(metadata)
    if longest is None:
        return DEFAULT_PER_TOKEN_CAP
    return min(batching.max_batch_size * longest, DEFAULT_PER_TOKEN_CAP)
