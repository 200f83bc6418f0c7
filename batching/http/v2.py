"""The KServe v2 HTTP protocol, as Triton Inference Server serves it.

Health, server and model metadata, model readiness, the repository index and ``infer`` with
JSON or binary tensor data; errors are ``{"error": "..."}`` with Triton's status codes.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.codecs.kserve import rows_from_tensor, tensor_from_rows
from batching.codecs.kserve_request import parse_infer_request
from batching.codecs.kserve_response import encode_infer_response
from batching.codecs.plain import check_texts
from batching.errors import InvalidRequest, UnprocessableInput
from batching.runtime.deployment import Deployment
from batching.service import DataPlane

from .errors import CLIENT_CLOSED, recorded
from .requests import infer_for_request, read_body, timeout_of

__all__ = ["EXTENSIONS", "v2_routes"]

#: The v2 extensions this server implements, as ``GET /v2`` lists them.
EXTENSIONS = ["binary_tensor_data", "model_repository", "schedule_policy", "parameters"]
HEADER_LENGTH = "inference-header-content-length"


def _json(document: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type="application/json")


def _server_version() -> str:
    try:
        return version("batching")
    except PackageNotFoundError:
        return "0+unknown"


def _output_names(deployment: Deployment) -> list[str]:
    outputs = deployment.metadata.get("outputs") or []
    return [str(output["name"]) for output in outputs] or ["output"]


def _input_names(deployment: Deployment) -> list[str]:
    inputs = deployment.metadata.get("inputs") or []
    return [str(tensor["name"]) for tensor in inputs]


def _batched_shape(shape: Any) -> list[int]:
    dims = [int(dim) for dim in shape] if isinstance(shape, list) else [-1]
    return dims if dims and dims[0] == -1 else [-1, *dims]


def model_metadata(deployment: Deployment) -> dict[str, Any]:
    """``GET /v2/models/{name}``: inputs and outputs with datatype and batched shape."""
    described = deployment.metadata

    def tensors(kind: str) -> list[dict[str, Any]]:
        return [
            {
                "name": tensor["name"],
                "datatype": tensor["datatype"],
                "shape": _batched_shape(tensor.get("shape")),
            }
            for tensor in described.get(kind) or []
        ]

    return {
        "name": deployment.name,
        "versions": [deployment.config.version],
        "platform": str(described.get("platform", "pytorch")),
        "inputs": tensors("inputs"),
        "outputs": tensors("outputs"),
    }


def model_config(deployment: Deployment) -> dict[str, Any]:
    """``GET /v2/models/{name}/config``: the serving configuration, in Triton's vocabulary."""
    config = deployment.config
    batching = config.batching
    return {
        "name": config.name,
        "version": config.version,
        "max_batch_size": batching.max_batch_size,
        "dynamic_batching": {
            "max_queue_delay_microseconds": round(batching.max_queue_delay * 1e6),
            "preferred_batch_size": list(batching.preferred_batch_sizes),
            "policy": batching.policy,
            "max_batch_tokens": batching.max_batch_tokens,
            "default_queue_policy": {
                "max_queue_size": batching.max_queue_size,
                "default_timeout_microseconds": round(batching.timeout * 1e6),
            },
        },
        "instance_group": [
            {"device": device, "kind": config.instance_kind} for device in config.devices
        ],
        "input": model_metadata(deployment)["inputs"],
        "output": model_metadata(deployment)["outputs"],
    }


def _header_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(
            f"Inference-Header-Content-Length must be an integer: {raw!r}"
        ) from None


def _timeout_parameter(parameters: dict[str, Any]) -> float | None:
    """Triton's schedule-policy ``timeout`` parameter (microseconds), in seconds."""
    timeout_us = parameters.get("timeout")
    if timeout_us is None:
        return None
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int | float) or timeout_us <= 0:
        raise InvalidRequest("parameter 'timeout' must be a positive number of microseconds")
    return float(timeout_us) / 1e6


def _lower(first: float | None, second: float | None) -> float | None:
    return second if first is None else first if second is None else min(first, second)


def v2_routes(plane: DataPlane, max_body_bytes: int) -> list[Route]:
    """The v2 routes over ``plane``; bodies over ``max_body_bytes`` get 413."""
    models = plane.deployments

    def deployment_of(request: Request) -> Deployment:
        params = request.path_params
        return models.get(params["model_name"], params.get("version"))

    async def server_metadata(request: Request) -> Response:
        return _json({"name": "batching", "version": _server_version(), "extensions": EXTENSIONS})

    async def metadata(request: Request) -> Response:
        return _json(model_metadata(deployment_of(request)))

    async def config(request: Request) -> Response:
        return _json(model_config(deployment_of(request)))

    async def ready(request: Request) -> Response:
        deployment = deployment_of(request)
        return _json(
            {"name": deployment.name, "ready": deployment.ready}, 200 if deployment.ready else 503
        )

    async def repository_index(request: Request) -> Response:
        index = []
        for deployment in models:
            entry = {
                "name": deployment.name,
                "version": deployment.config.version,
                "state": "READY" if deployment.ready else "UNAVAILABLE",
            }
            if not deployment.ready:
                entry["reason"] = deployment.load_error or "loading"
            index.append(entry)
        return _json(index)

    async def infer(request: Request) -> Response:
        deployment = deployment_of(request)
        with recorded(plane, deployment) as outcome:
            asked = timeout_of(request)
            header_length = _header_length(request)
            body = await read_body(request, max_body_bytes)
            parsed = parse_infer_request(body, header_length)
            asked = _lower(asked, _timeout_parameter(parsed.parameters))
            deadline = plane.deadline(deployment, asked)
            expected = _input_names(deployment)
            if len(parsed.inputs) != 1:
                raise InvalidRequest(
                    f"model {deployment.name!r} takes exactly one input"
                    + (f" ({expected[0]!r})" if expected else "")
                    + f", got {len(parsed.inputs)}"
                )
            tensor = parsed.inputs[0]
            if expected and tensor.name not in expected:
                raise InvalidRequest(
                    f"unexpected inference input {tensor.name!r} for model "
                    f"{deployment.name!r}; it takes {expected[0]!r}"
                )
            items = rows_from_tensor(tensor)
            if not items:
                raise InvalidRequest(f"input {tensor.name!r} has no items")
            if deployment.takes_text:
                if tensor.datatype != "BYTES":
                    raise UnprocessableInput(
                        f"model {deployment.name!r} takes BYTES (text) input, got {tensor.datatype}"
                    )
                check_texts(items)
            available = _output_names(deployment)
            for wanted in parsed.outputs:
                if wanted.name not in available:
                    raise InvalidRequest(
                        f"unexpected inference output {wanted.name!r} for model "
                        f"{deployment.name!r}; it has {', '.join(available)}"
                    )
            outputs = await infer_for_request(plane, request, deployment, items, deadline)
            if outputs is None:
                outcome.status = CLIENT_CLOSED
                return Response(status_code=CLIENT_CLOSED)
            name = available[0]
            body, length = encode_infer_response(
                deployment.name,
                deployment.config.version,
                parsed.id,
                [tensor_from_rows(name, outputs)],
                parsed.binary_output_names(available),
            )
            outcome.status = 200
            if length is None:
                return Response(body, media_type="application/json")
            return Response(
                body,
                media_type="application/octet-stream",
                headers={"Inference-Header-Content-Length": str(length)},
            )

    model = "/v2/models/{model_name}"
    versioned = "/v2/models/{model_name}/versions/{version}"
    routes = [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
    ]
    for prefix in (model, versioned):
        routes += [
            Route(prefix, metadata, methods=["GET"]),
            Route(prefix + "/config", config, methods=["GET"]),
            Route(prefix + "/ready", ready, methods=["GET"]),
            Route(prefix + "/infer", infer, methods=["POST"]),
        ]
    return routes
