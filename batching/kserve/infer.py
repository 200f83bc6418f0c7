"""A KServe v2 infer request for one deployment, whatever the transport: the items its tensors
carry (one tensor per declared input; several inputs make dict items), the deadline it asks
for, and the response tensors of the outputs."""

from __future__ import annotations

from typing import Any

from batching.codecs.inputs import InputSpec, input_specs, required_names
from batching.codecs.plain import check_texts
from batching.errors import InvalidRequest, UnprocessableInput
from batching.runtime.deployment import Deployment

from .describe import input_names, output_names
from .sparse import is_sparse, sparse_items_of, sparse_tensors
from .tensors import InferRequest, InferTensor, rows_from_tensor, tensor_from_rows

__all__ = ["items_of", "output_tensors", "timeout_parameter"]


def timeout_parameter(parameters: dict[str, Any]) -> float | None:
    """Triton's schedule-policy ``timeout`` parameter (microseconds), in seconds.

    :raises InvalidRequest: when it is not a positive number.
    """
    timeout_us = parameters.get("timeout")
    if timeout_us is None:
        return None
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int | float) or timeout_us <= 0:
        raise InvalidRequest("parameter 'timeout' must be a positive number of microseconds")
    return float(timeout_us) / 1e6


def items_of(deployment: Deployment, request: InferRequest) -> list[Any]:
    """The items ``request`` carries for ``deployment``, checked against its metadata.

    A model with one input takes one tensor, whose rows are the items. A model that declares
    several inputs takes one tensor per input sent (the optional ones may be left out), all
    with the same first dimension; item ``i`` is the dict of every tensor's row ``i``, by
    name (``text`` and ``text_pair`` for a text-pair classifier).

    :raises InvalidRequest: wrong input or output names, or no items.
    :raises UnprocessableInput: a text input sent as something other than BYTES.
    """
    specs = input_specs(deployment.metadata)
    if len(specs) > 1:
        items = _named_items(deployment, request, specs)
    else:
        items = sparse_items_of(deployment, request.parameters, _single_items(deployment, request))
    available = output_names(deployment)
    for wanted in request.outputs:
        if wanted.name not in available:
            raise InvalidRequest(
                f"unexpected inference output {wanted.name!r} for model "
                f"{deployment.name!r}; it has {', '.join(available)}"
            )
    return items


def _single_items(deployment: Deployment, request: InferRequest) -> list[Any]:
    expected = input_names(deployment)
    if len(request.inputs) != 1:
        raise InvalidRequest(
            f"model {deployment.name!r} takes exactly one input"
            + (f" ({expected[0]!r})" if expected else "")
            + f", got {len(request.inputs)}"
        )
    tensor = request.inputs[0]
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
    return items


def _named_items(
    deployment: Deployment, request: InferRequest, specs: list[InputSpec]
) -> list[dict[str, Any]]:
    by_name = {spec.name: spec for spec in specs}
    takes = ", ".join(repr(spec.name) for spec in specs)
    columns: dict[str, list[Any]] = {}
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidRequest(
                f"unexpected inference input {tensor.name!r} for model "
                f"{deployment.name!r}; it takes {takes}"
            )
        if tensor.name in columns:
            raise InvalidRequest(f"input {tensor.name!r} is sent twice")
        if spec.datatype == "BYTES" and tensor.datatype != "BYTES":
            raise UnprocessableInput(
                f"input {tensor.name!r} of model {deployment.name!r} is BYTES (text), "
                f"got {tensor.datatype}"
            )
        rows = rows_from_tensor(tensor)
        if spec.datatype == "BYTES":
            for index, row in enumerate(rows):
                if not isinstance(row, str):
                    raise UnprocessableInput(
                        f"input {tensor.name!r}: item {index} is {type(row).__name__}, "
                        "not one text (send shape [n] or [n, 1])"
                    )
        columns[tensor.name] = rows
    missing = [name for name in required_names(specs) if name not in columns]
    if missing:
        raise InvalidRequest(
            f"model {deployment.name!r} takes the inputs {takes}; "
            f"{', '.join(repr(name) for name in missing)} missing"
        )
    if not columns:
        raise InvalidRequest(f"model {deployment.name!r} takes the inputs {takes}; none sent")
    counts = {name: len(rows) for name, rows in columns.items()}
    if len(set(counts.values())) > 1:
        raise InvalidRequest(
            "every input needs the same first dimension (one row per item), got "
            + ", ".join(f"{name!r}: {count}" for name, count in counts.items())
        )
    count = next(iter(counts.values()))
    if not count:
        raise InvalidRequest("the inputs have no items")
    names = [spec.name for spec in specs if spec.name in columns]
    return [{name: columns[name][index] for name in names} for index in range(count)]


def output_tensors(deployment: Deployment, outputs: Any) -> list[InferTensor]:
    """The response tensors of ``outputs``, one row per item, under the model's output name;
    sparse vectors as two tensors, indices and values (:mod:`.sparse`)."""
    if is_sparse(outputs):
        return sparse_tensors(output_names(deployment), outputs)
    return [tensor_from_rows(output_names(deployment)[0], outputs)]
