"""What the KServe v2 protocol says about the server and its models, whatever the transport:
server metadata, model metadata, Triton's model configuration and statistics, and the
repository index.

Shapes follow Triton's convention for a model that batches (``max_batch_size > 0``): the
metadata's shapes start with the batch dimension ``-1``, the configuration's ``dims`` are the
same shapes per item (without it), and one value per item is ``[1]``. A text input is
therefore ``[-1, 1]`` in the metadata and ``dims: [1]`` in the configuration, which is what
Triton's clients send (``[n, 1]``); ``[n]`` is accepted too.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version

import orjson

from batching.codecs.capability import max_seq_length
from batching.control import model_states
from batching.metrics import Duration, ModelEvents, ModelStatistics
from batching.model_config import ModelConfig
from batching.models.parameters import PARAMETERS_KEY
from batching.models.protocol import MAX_SEQ_LENGTH_KEY, tensors_of
from batching.plane import Deployments
from batching.runtime.deployment import Deployment

from .multivector import ragged_parameters, token_output_metadata

__all__ = [
    "EXTENSIONS",
    "input_names",
    "item_dims",
    "model_config",
    "model_metadata",
    "model_statistics",
    "output_names",
    "repository_index",
    "server_metadata",
    "statistics",
    "triton_data_type",
]

#: The v2 extensions this server implements, as ``GET /v2`` lists them (Triton's names).
EXTENSIONS = [
    "binary_tensor_data",
    "model_repository",
    "model_configuration",
    "schedule_policy",
    "parameters",
    "statistics",
    "logging",
]

#: What runs the models, as the configuration's ``backend`` says.
BACKEND = "batching"


def server_version() -> str:
    try:
        return version("batching")
    except PackageNotFoundError:
        return "0+unknown"


def server_metadata() -> dict[str, object]:
    """``GET /v2``: the server's name, version and extensions."""
    return {"name": "batching", "version": server_version(), "extensions": EXTENSIONS}


def output_names(deployment: Deployment) -> list[str]:
    outputs = tensors_of(deployment.metadata, "outputs")
    return [str(output["name"]) for output in outputs] or ["output"]


def input_names(deployment: Deployment) -> list[str]:
    inputs = tensors_of(deployment.metadata, "inputs")
    return [str(tensor["name"]) for tensor in inputs]


def item_dims(shape: object) -> list[int]:
    """The per-item dims of a shape as a model describes it: without a leading ``-1`` (the
    batch dimension, which the models' metadata usually includes), and ``[1]`` for one value
    per item, as Triton spells a batched scalar."""
    dims = [int(dim) for dim in shape] if isinstance(shape, list | tuple) else [-1]
    if dims and dims[0] == -1:
        dims = dims[1:]
    return dims or [1]


def triton_data_type(datatype: str) -> str:
    """A v2 datatype as Triton's model configuration spells it: ``FP32`` is ``TYPE_FP32``,
    ``BYTES`` is ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _tensors(deployment: Deployment, kind: str) -> list[tuple[str, str, list[int]]]:
    """The model's inputs or outputs: name, v2 datatype and per-item dims."""
    return [
        (str(tensor["name"]), str(tensor["datatype"]), item_dims(tensor.get("shape")))
        for tensor in tensors_of(deployment.metadata, kind)
    ]


def _platform(deployment: Deployment) -> str:
    """What runs the model: its metadata's ``platform``, else ``pytorch`` for the packaged
    transformers-backed models and ``python`` for your own class."""
    return str(deployment.metadata.get("platform") or deployment.platform)


def model_metadata(deployment: Deployment) -> dict[str, object]:
    """``GET /v2/models/{name}``: inputs and outputs with datatype and batched shape."""

    def tensors(kind: str) -> list[dict[str, object]]:
        return [
            {"name": name, "datatype": datatype, "shape": [-1, *dims]}
            for name, datatype, dims in _tensors(deployment, kind)
        ]

    described: dict[str, object] = {
        "name": deployment.name,
        "versions": [deployment.config.version],
        "platform": _platform(deployment),
        "inputs": tensors("inputs"),
        "outputs": tensors("outputs"),
    }
    length = max_seq_length(deployment.metadata)
    if length is not None:
        # The most tokens a text input is read with (a longer one is cut to it, or refused
        # where the request says truncate: false); not a v2 field.
        described[MAX_SEQ_LENGTH_KEY] = length
    per_token = token_output_metadata(deployment)
    if per_token:
        # Outputs a request gets only by naming them: clients that ask for every listed
        # output (perf_analyzer) keep the pooled answer. Not a v2 field.
        described["per_token_outputs"] = per_token
    sparse = deployment.metadata.get("sparse")
    if isinstance(sparse, dict):
        # How a sparse model's indices and values tensors are padded, and its vocabulary.
        described["sparse"] = sparse
    engine = deployment.metadata.get("engine")
    if isinstance(engine, dict):
        # What runs the model and why (the figures measured at start-up); not a v2 field,
        # so clients that read only the protocol's fields ignore it.
        described["engine"] = engine
    embedding = deployment.metadata.get("embedding")
    if isinstance(embedding, dict):
        # The embedding options the model applies (prompts, max_seq_length, encodings, the
        # int8/uint8 quantization ranges calibrated at warm-up); not a v2 field either.
        described["embedding"] = embedding
    declared = deployment.metadata.get(PARAMETERS_KEY)
    if isinstance(declared, dict) and declared:
        # The request parameters a task takes (batching.models.parameters); not a v2 field.
        described["parameters"] = declared
    return described


def _engine_parameters(deployment: Deployment) -> dict[str, object]:
    engine = deployment.metadata.get("engine")
    if not isinstance(engine, dict):
        return {}
    return {
        "engine": engine.get("engine"),
        "precision": engine.get("precision"),
        "engine_decision": orjson.dumps(engine).decode(),
    }


def _embedding_parameters(deployment: Deployment) -> dict[str, object]:
    """An embedding model's options (prompts, quantization ranges...) as one JSON string, so
    that gRPC clients, whose metadata message has no room for them, can read them too; and
    whether it cuts over-long texts by default (``--no-truncate``)."""
    embedding = deployment.metadata.get("embedding")
    if not isinstance(embedding, dict):
        return {}
    return {
        "embedding": orjson.dumps(embedding).decode(),
        "truncate": str(deployment.config.truncate).lower(),
    }


def _sparse_parameters(deployment: Deployment) -> dict[str, object]:
    """A sparse model's description (vocabulary size, the padding of its indices and values
    tensors) as one JSON string, for gRPC clients, whose metadata message has no room for it."""
    sparse = deployment.metadata.get("sparse")
    return {"sparse": orjson.dumps(sparse).decode()} if isinstance(sparse, dict) else {}


def _parameters(values: dict[str, object]) -> dict[str, dict[str, str]]:
    """Triton's ``parameters`` map: every value a string, None left out."""
    return {key: {"string_value": str(value)} for key, value in values.items() if value is not None}


def _instance_groups(config: ModelConfig) -> list[dict[str, object]]:
    """One Triton instance group per distinct device: ``count`` instances on it."""
    counts: dict[str, int] = {}
    for device in config.devices:
        counts[device] = counts.get(device, 0) + 1
    groups = []
    for index, (device, count) in enumerate(counts.items()):
        kind, _, number = device.partition(":")
        if kind == "cpu":
            placement: dict[str, object] = {"kind": "KIND_CPU", "gpus": []}
        elif kind == "cuda":
            placement = {"kind": "KIND_GPU", "gpus": [int(number) if number.isdigit() else 0]}
        else:  # another torch device (mps, xpu, ...): Triton has no kind for it
            placement = {"kind": "KIND_MODEL", "gpus": []}
        groups.append({"name": f"{config.name}_{index}", "count": count, **placement})
    return groups


def _version_policy(version: str) -> dict[str, object]:
    """Triton's versions are int64: ours is named when it is one, else "the latest one"."""
    if version.isascii() and version.isdigit() and int(version) < 2**63:
        return {"specific": {"versions": [int(version)]}}
    return {"latest": {"num_versions": 1}}


def model_config(deployment: Deployment) -> dict[str, object]:
    """``GET /v2/models/{name}/config``: the serving configuration as Triton's ``ModelConfig``
    (its protobuf's JSON form: every key is a field of that message, with the field's type).
    What Triton has no field for (the batching policy, the token cap, ...) is in
    ``parameters``, as strings."""
    config = deployment.config
    batching = config.batching

    def tensors(kind: str) -> list[dict[str, object]]:
        return [
            {"name": name, "data_type": triton_data_type(datatype), "dims": dims}
            for name, datatype, dims in _tensors(deployment, kind)
        ]

    inputs = tensors("inputs")
    for entry, described in zip(inputs, tensors_of(deployment.metadata, "inputs"), strict=True):
        if described.get("optional"):
            entry["optional"] = True  # a field of Triton's ModelInput (not of ModelOutput)

    return {
        "name": config.name,
        "platform": _platform(deployment),
        "backend": BACKEND,
        "version_policy": _version_policy(config.version),
        "max_batch_size": batching.max_batch_size,
        "input": inputs,
        "output": tensors("outputs"),
        "dynamic_batching": {
            "preferred_batch_size": list(batching.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(batching.max_queue_delay * 1e6),
            "preserve_ordering": False,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(batching.timeout * 1e6),
                # A request may lower the timeout (never raise it).
                "allow_timeout_override": True,
                "max_queue_size": batching.max_queue_size,
            },
        },
        "instance_group": _instance_groups(config),
        "model_transaction_policy": {"decoupled": False},
        "response_cache": {"enable": False},
        "parameters": _parameters(
            {
                "version": config.version,
                "policy": batching.policy,
                "max_latency_microseconds": (
                    round(batching.max_latency * 1e6) if batching.policy == "adaptive" else None
                ),
                "max_batch_tokens": batching.max_batch_tokens,
                "max_items_per_request": batching.max_items_per_request,
                "queue_close_ratio": batching.queue_close_ratio,
                "instance_kind": config.instance_kind,
                "devices": ",".join(config.devices),
                MAX_SEQ_LENGTH_KEY: max_seq_length(deployment.metadata),
                **_engine_parameters(deployment),
                **_embedding_parameters(deployment),
                **ragged_parameters(deployment),
                **_sparse_parameters(deployment),
            }
        ),
    }


def _statistics_of(deployment: Deployment) -> ModelStatistics:
    events = deployment.batcher.events
    if isinstance(events, ModelEvents):
        return events.statistics
    return ModelStatistics()  # observed by something else (a test's recorder): nothing counted


def _leaf(duration: Duration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def model_statistics(deployment: Deployment) -> dict[str, object]:
    """One model's statistics since the server started, as Triton's ``ModelStatistics``
    (the statistics extension): per request ``success`` and ``fail`` (count and whole
    duration in the batcher), ``queue`` and ``compute_infer`` of the successful ones (a
    batch's compute counts in full for each request in it); ``compute_input`` and
    ``compute_output`` are counted but take no time of their own here (the model's compute
    includes them). ``inference_count`` counts items, ``execution_count`` batches;
    ``batch_stats`` has one entry per batch size run. Every leaf is ``{"count", "ns"}``."""
    stats = _statistics_of(deployment)
    untimed = {"count": stats.success.count, "ns": 0}
    return {
        "name": deployment.name,
        "version": deployment.config.version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _leaf(stats.success),
            "fail": _leaf(stats.fail),
            "queue": _leaf(stats.queue),
            "compute_input": dict(untimed),
            "compute_infer": _leaf(stats.compute_infer),
            "compute_output": dict(untimed),
            "cache_hit": {"count": 0, "ns": 0},
            "cache_miss": {"count": 0, "ns": 0},
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": {"count": batches.count, "ns": 0},
                "compute_infer": _leaf(batches),
                "compute_output": {"count": batches.count, "ns": 0},
            }
            for size, batches in sorted(stats.batches.items())
        ],
    }


def statistics(deployments: Iterable[Deployment]) -> dict[str, object]:
    """``GET /v2/models[/{name}]/stats``: ``{"model_stats": [...]}`` of ``deployments``, one
    :func:`model_statistics` each (Triton's ``ModelStatisticsResponse``)."""
    return {"model_stats": [model_statistics(deployment) for deployment in deployments]}


def repository_index(deployments: Deployments) -> list[dict[str, object]]:
    """``POST /v2/repository/index``: every model and version, its state, and why it is not
    ready (:func:`batching.control.model_states`)."""
    return model_states(deployments)
