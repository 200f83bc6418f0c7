"""Per-token vectors on the v2 door (HTTP and gRPC alike): ragged outputs.

A model that serves per-token vectors (its ``"embedding"`` metadata lists ``"tokens"`` among
its outputs) has three more outputs, which a request gets only by asking for them by name
(they are described apart from the listed ``outputs``, under ``per_token_outputs``, so a client
that asks for every listed output, as perf_analyzer does, keeps the pooled answer):

- ``token_embeddings``: FP32 ``[total_tokens, dim]``, every item's token vectors one after
  another, in item order;
- ``token_ids``: INT64 ``[total_tokens]``, the id of each of those rows;
- ``token_counts``: INT64 ``[n]``, how many rows each item has (so item ``i``'s rows start at
  the sum of the counts before it).

Asking for any of them makes the items ``EmbedItem(output="tokens")``; asking for
``embedding`` (or for nothing) keeps the pooled answer, and asking for both kinds at once is a
400. The request's parameters are the embedding options (``prompt_name``, ``input_type``,
``truncate``, ``truncation_direction``), as in ``/embed_all``. The first dimension of the two
ragged outputs counts tokens, not items: the model metadata says so with ``"ragged": true`` on
them, and the configuration with its ``ragged_outputs`` parameter (its ``per_token_outputs``
parameter holds their ``ModelOutput`` entries as JSON, for gRPC clients).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from batching.codecs.capability import TOKENS, capable, token_dimension
from batching.errors import InferenceFailed, InvalidRequest
from batching.models.items import TokenVectors
from batching.runtime.deployment import Deployment

from .tensors import InferRequest, InferTensor

__all__ = [
    "RAGGED_OUTPUTS",
    "TOKEN_OUTPUTS",
    "asks_tokens",
    "ragged_parameters",
    "token_output_config",
    "token_output_metadata",
    "token_output_names",
    "token_tensors",
]

TOKEN_OUTPUTS = ("token_embeddings", "token_ids", "token_counts")
#: The outputs whose first dimension counts tokens, not items.
RAGGED_OUTPUTS = ("token_embeddings", "token_ids")


def token_output_names(deployment: Deployment) -> list[str]:
    """The per-token outputs of ``deployment``: all three, or none when it has none."""
    return list(TOKEN_OUTPUTS) if capable(deployment.metadata, TOKENS) else []


def token_output_metadata(deployment: Deployment) -> list[dict[str, object]]:
    """The per-token outputs as the v2 model metadata lists them."""
    if not token_output_names(deployment):
        return []
    dim = token_dimension(deployment.metadata) or -1
    rows = "rows per item in token_counts"
    return [
        {
            "name": "token_embeddings",
            "datatype": "FP32",
            "shape": [-1, dim],
            "ragged": True,
            "description": f"every item's token vectors one after another; {rows}",
        },
        {
            "name": "token_ids",
            "datatype": "INT64",
            "shape": [-1],
            "ragged": True,
            "description": f"the token id of each token_embeddings row; {rows}",
        },
        {
            "name": "token_counts",
            "datatype": "INT64",
            "shape": [-1],
            "description": "how many token_embeddings rows each item has",
        },
    ]


def token_output_config(deployment: Deployment) -> list[dict[str, object]]:
    """The per-token outputs as Triton's ``ModelOutput`` entries: a vector per row, and one
    value per row reshaped to a flat ``[-1]``, as Triton spells a 1-D batched output."""
    if not token_output_names(deployment):
        return []
    dim = token_dimension(deployment.metadata) or -1
    flat = {"dims": [1], "reshape": {"shape": []}}
    return [
        {"name": "token_embeddings", "data_type": "TYPE_FP32", "dims": [dim]},
        {"name": "token_ids", "data_type": "TYPE_INT64", **flat},
        {"name": "token_counts", "data_type": "TYPE_INT64", **flat},
    ]


def ragged_parameters(deployment: Deployment) -> dict[str, object]:
    """The configuration's parameters that say which outputs are ragged, and what gives
    their rows per item (Triton's ``ModelOutput`` has no field for it)."""
    if not token_output_names(deployment):
        return {}
    return {
        "per_token_outputs": json.dumps(token_output_config(deployment)),
        "ragged_outputs": ",".join(RAGGED_OUTPUTS),
        "ragged_row_counts": "token_counts",
    }


def asks_tokens(deployment: Deployment, request: InferRequest) -> bool:
    """Whether ``request`` asks for per-token outputs (their names already checked to be
    ``deployment``'s).

    :raises InvalidRequest: it asks for per-token and pooled outputs at once.
    """
    names = [output.name for output in request.outputs]
    if not any(name in TOKEN_OUTPUTS for name in names):
        return False
    others = [name for name in names if name not in TOKEN_OUTPUTS]
    if others:
        raise InvalidRequest(
            f"ask for the per-token outputs ({', '.join(TOKEN_OUTPUTS)}) or for "
            f"{', '.join(repr(name) for name in others)}, not both in one request"
        )
    return True


def token_tensors(vectors: Sequence[TokenVectors], requested: Sequence[str]) -> list[InferTensor]:
    """The ragged response tensors of per-token ``vectors`` (checked, one per item), those
    ``requested`` in order (all three when none is named).

    :raises InferenceFailed: the model broke the contract (items of different widths).
    """
    requested = [name for name in requested if name in TOKEN_OUTPUTS] or list(TOKEN_OUTPUTS)
    widths = {output.vectors.shape[1] for output in vectors}
    if len(widths) > 1:
        raise InferenceFailed(f"the model answered token vectors of widths {sorted(widths)}")
    embeddings = np.ascontiguousarray(np.concatenate([output.vectors for output in vectors]))
    ids = np.ascontiguousarray(np.concatenate([output.ids for output in vectors]))
    counts = np.array([len(output.ids) for output in vectors], dtype=np.int64)
    tensors = {
        "token_embeddings": InferTensor(
            "token_embeddings", "FP32", list(embeddings.shape), embeddings
        ),
        "token_ids": InferTensor("token_ids", "INT64", list(ids.shape), ids),
        "token_counts": InferTensor("token_counts", "INT64", list(counts.shape), counts),
    }
    return [tensors[name] for name in requested]
