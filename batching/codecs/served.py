"""What each model serves, as ``GET /v1/models`` lists it: OpenAI's model object (``id``,
``object``, ``created``, ``owned_by``) with what a client needs to pick a model beside it, as
vLLM adds ``max_model_len``:

- ``task``: the task it was served with (``--task``), else what its outputs make it
  (``embedding``, ``sparse-embedding``, ``text-pair-classification``, ``custom``);
- ``endpoints``: the routes that take it (its own plain and KServe v2 routes, and the
  OpenAI, rerank, sparse and generate doors that serve its kind);
- ``max_model_len``: the most tokens an input is read with, where the model states it.
"""

from __future__ import annotations

from collections.abc import Mapping

from batching.models.tasks.generation import CHAT_TEMPLATE_KEY, streams

from .inputs import takes_pairs
from .openai import is_embedding_model
from .sparse import serves_sparse

__all__ = ["max_model_len", "served"]


def served(name: str, metadata: Mapping[str, object], task: str | None) -> dict[str, object]:
    """What model ``name`` serves, from its metadata (empty while it loads) and its task."""
    endpoints = [f"/models/{name}", f"/v2/models/{name}/infer"]
    kind = task
    declared = metadata.get("task")
    if streams(declared if isinstance(declared, str) and declared else task):
        endpoints += ["/v1/completions"]
        if metadata.get(CHAT_TEMPLATE_KEY):
            endpoints += ["/v1/chat/completions"]
        endpoints += [f"/v2/models/{name}/generate", f"/v2/models/{name}/generate_stream"]
    elif serves_sparse(metadata):
        kind = kind or "sparse-embedding"
        endpoints += ["/embed_sparse"]
    elif is_embedding_model(metadata):
        kind = kind or "embedding"
        endpoints += ["/v1/embeddings"]
    elif takes_pairs(metadata):
        kind = kind or "text-pair-classification"
        endpoints += ["/v1/rerank"]
    described: dict[str, object] = {"task": kind or ("custom" if metadata else None)}
    described["endpoints"] = endpoints
    length = max_model_len(metadata)
    if length is not None:
        described["max_model_len"] = length
    return described


def max_model_len(metadata: Mapping[str, object]) -> int | None:
    """The most tokens an input of the model is read with, where its metadata says."""
    embedding = metadata.get("embedding")
    for value in (
        metadata.get("max_seq_length"),
        embedding.get("max_seq_length") if isinstance(embedding, Mapping) else None,
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
