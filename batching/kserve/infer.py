"""A KServe v2 infer request for one deployment, whatever the transport: the items its tensors
carry (one tensor per declared input; several inputs make dict items), the deadline it asks
for, the embedding options its parameters set, and the response tensors of the outputs.

Request parameters are Triton's (:data:`TRITON_PARAMETERS`, which tritonclient and
perf_analyzer send), a task's parameters (:mod:`batching.codecs.task_parameters`) or embedding
options (:mod:`batching.codecs.embed_options`); any other is a 400, never ignored. An
embedding answer's tensor follows its encoding (FP32 ``[n, dim]``;
INT8 or UINT8 ``[n, dim]`` for int8/uint8; INT8 or UINT8 ``[n, ceil(dim/8)]`` for
binary/ubinary; BYTES ``[n, 1]`` of base64 text for the ``base64`` encodings), and the
response's parameters say which texts were cut and the tokens used
(:func:`embedding_parameters`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batching.codecs.embed_options import (
    EmbedPlan,
    encode_vector,
    read_options,
)
from batching.codecs.embedding import EmbedAnswer
from batching.codecs.inputs import InputSpec, check_exclusive, input_specs, required_names
from batching.codecs.multivector import TokenAnswer, token_options
from batching.codecs.plain import check_texts
from batching.codecs.plans import embeds, per_token_plan, pooled_plan
from batching.codecs.sparse import OPTIONS as SPARSE_OPTIONS
from batching.codecs.sparse import serves_sparse
from batching.codecs.task_parameters import declares_parameters, list_values, task_items
from batching.errors import InvalidRequest, UnprocessableInput
from batching.models.items import Item
from batching.runtime.deployment import Deployment

from .describe import input_names, output_names
from .media import media_rows
from .multivector import asks_tokens, token_output_names, token_tensors
from .sparse import is_sparse, sparse_items_of, sparse_tensors
from .tensors import InferRequest, InferTensor, rows_from_tensor, tensor_from_rows

__all__ = [
    "OUTPUT_OPTIONS",
    "TRITON_OUTPUT_PARAMETERS",
    "TRITON_PARAMETERS",
    "embedding_parameters",
    "embedding_plan",
    "embedding_tensors",
    "items_of",
    "output_tensors",
    "task_items_of",
    "timeout_parameter",
    "token_answer_parameters",
    "token_answer_tensors",
    "token_plan_of",
]

#: Request parameters of Triton's protocol, accepted on every model: the schedule policy
#: (``timeout``, ``priority``), sequence batching (``sequence_*``), binary outputs, and what
#: perf_analyzer sends for decoupled models. Only ``timeout`` and ``binary_data_output`` act.
TRITON_PARAMETERS = frozenset(
    {
        "timeout",
        "priority",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "binary_data_output",
        "triton_enable_empty_final_response",
    }
)


def timeout_parameter(parameters: dict[str, object]) -> float | None:
    """Triton's schedule-policy ``timeout`` parameter (microseconds), in seconds.

    :raises InvalidRequest: when it is not a positive number.
    """
    timeout_us = parameters.get("timeout")
    if timeout_us is None:
        return None
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int | float) or timeout_us <= 0:
        raise InvalidRequest("parameter 'timeout' must be a positive number of microseconds")
    return float(timeout_us) / 1e6


def items_of(deployment: Deployment, request: InferRequest) -> Sequence[Item]:
    """The items ``request`` carries for ``deployment``, checked against its metadata.

    A model with one input takes one tensor, whose rows are the items. A model that declares
    several inputs takes one tensor per input sent (the optional ones may be left out), all
    with the same first dimension; item ``i`` is the dict of every tensor's row ``i``, by
    name (``text`` and ``text_pair`` for a text-pair classifier).

    :raises InvalidRequest: wrong input or output names, or no items.
    :raises UnprocessableInput: a text input sent as something other than BYTES.
    """
    specs = input_specs(deployment.metadata)
    items: Sequence[Item]
    if len(specs) > 1:
        items = _named_items(deployment, request, specs)
    elif specs and specs[0].content is not None:
        # One media input: bytes per item (raw, or base64 in JSON), never text.
        items = list(media_rows(_single_tensor(deployment, request), specs[0].content))
    else:
        options = {
            key: value
            for key, value in request.parameters.items()
            if key not in TRITON_PARAMETERS and value is not None
        }
        items = sparse_items_of(deployment, options, _single_items(deployment, request))
    available = output_names(deployment) + token_output_names(deployment)
    for wanted in request.outputs:
        if wanted.name not in available:
            raise InvalidRequest(
                f"unexpected inference output {wanted.name!r} for model "
                f"{deployment.name!r}; it has {', '.join(available)}"
            )
    return items


def _single_tensor(deployment: Deployment, request: InferRequest) -> InferTensor:
    """The one input tensor of a model with one input, checked by name."""
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
    return tensor


def _single_items(deployment: Deployment, request: InferRequest) -> Sequence[Item]:
    tensor = _single_tensor(deployment, request)
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
) -> list[dict[str, Item]]:
    by_name = {spec.name: spec for spec in specs}
    takes = ", ".join(repr(spec.name) for spec in specs)
    columns: dict[str, list[Item]] = {}
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidRequest(
                f"unexpected inference input {tensor.name!r} for model "
                f"{deployment.name!r}; it takes {takes}"
            )
        if tensor.name in columns:
            raise InvalidRequest(f"input {tensor.name!r} is sent twice")
        if spec.content is not None:
            columns[tensor.name] = list(media_rows(tensor, spec.content))
            continue
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
    items = [{name: columns[name][index] for name in names} for index in range(count)]
    for index, item in enumerate(items):
        check_exclusive(item, specs, f"item {index}")
    return items


def task_items_of(
    deployment: Deployment, request: InferRequest, items: Sequence[Item]
) -> Sequence[Item] | None:
    """``items`` with the task parameters ``request`` sets (its parameters but Triton's),
    checked (:mod:`batching.codecs.task_parameters`), when ``deployment`` serves a task that
    declares parameters; None otherwise (the request goes the embedding or plain way). A list
    parameter may be sent as a string holding a JSON array, as gRPC's scalar parameters need.

    :raises InvalidRequest: an unknown or ill-typed parameter, naming it, or an output
        parameter that is not Triton's (a task's outputs take none).
    """
    if not declares_parameters(deployment):
        return None
    for output in request.outputs:
        for key, value in output.parameters.items():
            if key not in TRITON_OUTPUT_PARAMETERS and value is not None:
                raise InvalidRequest(
                    f"output {output.name!r} has the unknown parameter {key!r}; an output "
                    f"takes {', '.join(sorted(TRITON_OUTPUT_PARAMETERS))}"
                )
    given = {
        key: value
        for key, value in request.parameters.items()
        if key not in TRITON_PARAMETERS and value is not None
    }
    return task_items(
        deployment,
        items,
        list_values(deployment, given) if given else given,
        where="the request's parameters",
    )


def output_tensors(deployment: Deployment, outputs: Any) -> list[InferTensor]:
    """The response tensors of ``outputs``, one row per item, under the model's output name;
    sparse vectors as two tensors, indices and values (:mod:`.sparse`)."""
    if is_sparse(outputs):
        return sparse_tensors(output_names(deployment), outputs)
    return [tensor_from_rows(output_names(deployment)[0], outputs)]


#: Parameters of a requested output in Triton's protocol (the ones this server refuses, such
#: as ``classification``, are refused when the request is parsed).
TRITON_OUTPUT_PARAMETERS = frozenset(
    {
        "binary_data",
        "classification",
        "shared_memory_region",
        "shared_memory_byte_size",
        "shared_memory_offset",
    }
)
#: Embedding options a requested output may carry instead of the request: they shape it.
OUTPUT_OPTIONS = frozenset({"encoding", "dimensions"})


def embedding_plan(
    deployment: Deployment, request: InferRequest, items: Sequence[Item]
) -> EmbedPlan | None:
    """The embedding plan of ``request``'s parameters (and of its requested output's
    ``encoding`` and ``dimensions``), or None when the request goes the plain way (a model
    without embedding options, asked for none).

    :raises OptionError: an unknown parameter, or an option the model cannot apply.
    """
    options = _request_options(request)
    metadata = deployment.metadata
    if serves_sparse(metadata):
        # A sparse model's options were applied by items_of (:mod:`.sparse`).
        unknown = sorted(key for key in options if key not in SPARSE_OPTIONS)
        if unknown:
            raise InvalidRequest(
                f"model {deployment.name!r} takes no parameter "
                f"{', '.join(repr(key) for key in unknown)}; a sparse model takes "
                f"{', '.join(SPARSE_OPTIONS)} and Triton's: {', '.join(sorted(TRITON_PARAMETERS))}"
            )
        return None

    def refusal() -> str:
        return (
            f"model {deployment.name!r} takes no parameter "
            f"{', '.join(repr(key) for key in options)}; the parameters it takes are "
            f"Triton's: {', '.join(sorted(TRITON_PARAMETERS))}"
        )

    if not embeds(deployment, options, refusal):
        return None
    read = read_options(options, where="the request's parameters")
    return pooled_plan(deployment, check_texts(items), read)


def _request_options(request: InferRequest) -> dict[str, object]:
    """The embedding options ``request`` sets: its parameters but Triton's own, and its
    requested outputs' ``encoding`` and ``dimensions``.

    :raises InvalidRequest: an output parameter that is neither Triton's nor an option, or an
        option set differently on the request and on an output.
    """
    options = {
        key: value
        for key, value in request.parameters.items()
        if key not in TRITON_PARAMETERS and value is not None
    }
    for output in request.outputs:
        for key, value in output.parameters.items():
            if key in TRITON_OUTPUT_PARAMETERS or value is None:
                continue
            if key not in OUTPUT_OPTIONS:
                raise InvalidRequest(
                    f"output {output.name!r} has the unknown parameter {key!r}; an output "
                    f"takes {', '.join(sorted(TRITON_OUTPUT_PARAMETERS | OUTPUT_OPTIONS))}"
                )
            if key in options and options[key] != value:
                raise InvalidRequest(
                    f"{key!r} is set both on the request and on output {output.name!r}"
                )
            options[key] = value
    return options


def embedding_tensors(
    deployment: Deployment, plan: EmbedPlan, answer: EmbedAnswer
) -> list[InferTensor]:
    """The response tensor of an embedding answer, typed by its encoding."""
    name = output_names(deployment)[0]
    if plan.options.base64:
        texts = [encode_vector(vector, True) for vector in answer.vectors]
        return [tensor_from_rows(name, texts)]
    return [tensor_from_rows(name, answer.vectors)]


def embedding_parameters(answer: EmbedAnswer) -> dict[str, object]:
    """The response parameters of an embedding answer: ``truncated`` (whether the model cut
    any text), ``truncated_inputs`` (which, as comma-separated indices; "" when none) and
    ``prompt_tokens`` (tokens used, prompts included), where known."""
    parameters: dict[str, object] = {}
    if answer.truncated is not None:
        parameters["truncated"] = any(answer.truncated)
        parameters["truncated_inputs"] = ",".join(
            str(index) for index, cut in enumerate(answer.truncated) if cut
        )
    if answer.tokens is not None:
        parameters["prompt_tokens"] = answer.tokens
    return parameters


def token_plan_of(
    deployment: Deployment, request: InferRequest, texts: Sequence[Item]
) -> EmbedPlan | None:
    """The per-token plan of ``request`` when it asks for the per-token outputs (see
    :mod:`batching.kserve.multivector`), its parameters read as embedding options; None
    otherwise.

    :raises InvalidRequest: per-token and pooled outputs asked at once, an unknown parameter,
        or an option the model cannot apply to per-token vectors.
    """
    if not asks_tokens(deployment, request):
        return None
    options = _request_options(request)
    read = token_options(options, where="the request's parameters")
    return per_token_plan(deployment, check_texts(texts), read)


def token_answer_tensors(request: InferRequest, answer: TokenAnswer) -> list[InferTensor]:
    """The ragged tensors of a per-token answer, those the request named."""
    return token_tensors(answer.outputs, [output.name for output in request.outputs])


def token_answer_parameters(answer: TokenAnswer) -> dict[str, object]:
    """The response parameters of a per-token answer, as :func:`embedding_parameters` gives
    them for pooled ones (which texts were cut, the tokens used)."""
    return embedding_parameters(EmbedAnswer([], answer.truncated, answer.tokens))
