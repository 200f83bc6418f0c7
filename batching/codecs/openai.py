"""The OpenAI embeddings API's wire format: ``POST /v1/embeddings`` and ``GET /v1/models``
bodies, and OpenAI's error document. Pure functions over bytes, numpy and orjson.

What a request may carry follows OpenAI's API and limits:

- ``model`` (required): the name of a served embedding model;
- ``input`` (required): a string or a list of at most :data:`MAX_INPUTS` strings, none empty.
  Token-id arrays (``[int]``, ``[[int]]``) are another tokenizer's ids (tiktoken's, as
  LangChain's ``OpenAIEmbeddings`` sends by default): they are refused with a 400 naming the
  client setting that sends text, never embedded as if they were text;
- ``encoding_format``: ``"float"`` (the default when absent) or ``"base64"`` (the
  little-endian float32 bytes of each vector, what the ``openai`` SDK asks for by default);
  for models that quantize, ``int8``, ``uint8``, ``binary``, ``ubinary`` (integer lists) or
  those followed by ``+base64`` (the integer bytes, base64-encoded);
- ``dimensions``: fewer dimensions than the model's, for models whose vectors are unit
  vectors: the vector is truncated and re-normalised. Asking a model whose vectors are not
  normalised for anything but its own width is a 400;
- ``prompt_name``, ``input_type``, ``truncate``, ``truncation_direction``: the embedding
  options every door takes (:mod:`.embed_options`), sent with the SDK's ``extra_body``;
- ``user``: accepted, unused. Any other key is a 400 naming it, never ignored.

Token limits, counted with the served model's own tokenizer (special tokens included): an
input over :data:`MAX_INPUT_TOKENS` tokens is refused, as OpenAI does, and so is a request
over :data:`MAX_REQUEST_TOKENS`. An input within those limits but longer than the model's own
maximum length (256 tokens for all-MiniLM-L6-v2) is truncated at that length, as the model
always does; ``usage`` counts the tokens the model ran, after that truncation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from batching import errors
from batching.documents import JSONObject, listed, parse_object, per_document
from batching.errors import BatchingError, InvalidRequest

from .capability import first_output
from .embed_options import WIRE_ENCODINGS, EmbedOptions, encode_vector, read_options
from .json_types import json_type

__all__ = [
    "CODES",
    "code_of",
    "ENCODING_FORMATS",
    "LANGCHAIN_HINT",
    "MAX_INPUTS",
    "MAX_INPUT_TOKENS",
    "MAX_REQUEST_TOKENS",
    "EmbeddingsRequest",
    "OpenAIError",
    "check_token_limits",
    "encode_embeddings",
    "encode_model",
    "encode_models",
    "error_document",
    "is_embedding_model",
    "json_object",
    "model_name",
    "parse_embeddings_request",
]

#: Most inputs in one request (OpenAI's limit).
MAX_INPUTS = 2048
#: Most tokens in one input (OpenAI's limit for its embedding models).
MAX_INPUT_TOKENS = 8192
#: Most tokens in one request, all inputs together (OpenAI's limit).
MAX_REQUEST_TOKENS = 300_000

ENCODING_FORMATS = WIRE_ENCODINGS

#: The body's own fields, beside the embedding options (:mod:`.embed_options`).
OWN_FIELDS = ("model", "input", "user")

#: What to do instead of sending token ids.
LANGCHAIN_HINT = (
    "send the texts themselves instead; with LangChain's OpenAIEmbeddings, set "
    "check_embedding_ctx_length=False (it otherwise sends tiktoken token ids)"
)


class OpenAIError(InvalidRequest):
    """A request the OpenAI doors refuse (400), with OpenAI's ``param`` and ``code``."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A parsed ``POST /v1/embeddings`` body."""

    model: str
    texts: list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    options: EmbedOptions = field(default_factory=EmbedOptions)


#: OpenAI's ``code`` of each error the tree raises, where the error does not carry its own.
CODES: dict[type[BatchingError], str] = {
    errors.ModelNotFound: "model_not_found",
    errors.PayloadTooLarge: "request_too_large",
    errors.UnprocessableInput: "unprocessable_input",
    errors.InvalidRequest: "invalid_request",
    errors.Overloaded: "overloaded",
    errors.NotReady: "not_ready",
    errors.Unavailable: "unavailable",
    errors.DeadlineExceeded: "timeout",
    errors.InferenceFailed: "inference_failed",
}


def code_of(exc: BatchingError) -> str | None:
    """OpenAI's ``code`` of ``exc``: its own, else its nearest class's in :data:`CODES`."""
    own = getattr(exc, "code", None)
    if isinstance(own, str):
        return own
    for cls in type(exc).__mro__:
        code = CODES.get(cls)
        if code is not None:
            return code
    return None


def json_object(body: bytes) -> JSONObject:
    """The request body as a JSON object.

    :raises OpenAIError: not JSON, or not an object.
    """
    return parse_object(
        body,
        lambda exc: OpenAIError(f"the request body is not valid JSON: {exc}", code="invalid_json"),
        lambda other: OpenAIError(
            f"the request body must be a JSON object, not {json_type(other)}",
            code="invalid_type",
        ),
    )


def model_name(document: Mapping[str, object]) -> str:
    """The required ``model`` of a request.

    :raises OpenAIError: missing, or not a non-empty string.
    """
    if document.get("model") is None:
        raise OpenAIError(
            "you must provide a model parameter", param="model", code="missing_required_parameter"
        )
    model = document["model"]
    if not isinstance(model, str) or not model:
        raise OpenAIError(
            f"model must be a non-empty string, not {json_type(model)}",
            param="model",
            code="invalid_type",
        )
    return model


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids_error(where: str) -> OpenAIError:
    return OpenAIError(
        f"{where} is an array of token ids: they are another tokenizer's ids, and this server "
        f"embeds text with the model's own tokenizer, so it cannot read them; {LANGCHAIN_HINT}",
        param="input",
        code="token_ids_not_supported",
    )


def _texts(value: object) -> list[str]:
    if value is None:
        raise OpenAIError(
            "you must provide an input parameter: a string or an array of strings",
            param="input",
            code="missing_required_parameter",
        )
    if isinstance(value, str):
        if not value:
            raise OpenAIError("input is an empty string", param="input", code="invalid_value")
        return [value]
    if not isinstance(value, list):
        raise OpenAIError(
            f"input must be a string or an array of strings, not {json_type(value)}",
            param="input",
            code="invalid_type",
        )
    if not value:
        raise OpenAIError("input is an empty array", param="input", code="invalid_value")
    if all(_is_token_id(item) for item in value):
        raise _token_ids_error("input")
    if len(value) > MAX_INPUTS:
        raise OpenAIError(
            f"input has {len(value)} items; a request may carry at most {MAX_INPUTS}",
            param="input",
            code="too_many_inputs",
        )
    for index, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise OpenAIError(
                    f"input[{index}] is an empty string", param="input", code="invalid_value"
                )
            continue
        if isinstance(item, list) and all(_is_token_id(token) for token in item):
            raise _token_ids_error(f"input[{index}]")
        raise OpenAIError(
            f"input[{index}] is {json_type(item)}; input must be a string or an array of strings",
            param="input",
            code="invalid_type",
        )
    return value


def parse_embeddings_request(body: bytes) -> EmbeddingsRequest:
    """A ``POST /v1/embeddings`` body, checked against the API and its limits (those on
    tokens need the model's tokenizer: :func:`check_token_limits`).

    :raises OpenAIError: naming the parameter at fault.
    :raises OptionError: an unknown parameter, or an option of the wrong type, naming it.
    """
    document = json_object(body)
    model = model_name(document)
    texts = _texts(document.get("input"))
    options = read_options(
        document,
        where="the request",
        names={"encoding_format": "encoding"},
        ignore=OWN_FIELDS,
    )
    return EmbeddingsRequest(model, texts, options.wire_encoding, options.dimensions, options)


def check_token_limits(lengths: Sequence[int]) -> None:
    """Refuse inputs over :data:`MAX_INPUT_TOKENS` tokens and requests over
    :data:`MAX_REQUEST_TOKENS`, given each input's length before truncation.

    :raises OpenAIError: naming the first input over the limit.
    """
    for index, length in enumerate(lengths):
        if length > MAX_INPUT_TOKENS:
            raise OpenAIError(
                f"input[{index}] has more than {MAX_INPUT_TOKENS} tokens, the most one input "
                "may have; shorten it or split it",
                param="input",
                code="context_length_exceeded",
            )
    total = sum(lengths)
    if total > MAX_REQUEST_TOKENS:
        raise OpenAIError(
            f"the inputs have {total} tokens together; a request may have at most "
            f"{MAX_REQUEST_TOKENS}: send fewer inputs per request",
            param="input",
            code="max_tokens_per_request",
        )


# --- what a model's metadata says ----------------------------------------------------------


@per_document
def is_embedding_model(metadata: Mapping[str, object]) -> bool:
    """Whether a model's metadata describes an embedding model: its first input is text
    (BYTES) and its first output one FP32 vector per item (shape ``[-1, dim]``)."""
    inputs = listed(metadata.get("inputs"))
    if not inputs or not isinstance(inputs[0], Mapping) or inputs[0].get("datatype") != "BYTES":
        return False
    if any(isinstance(extra, Mapping) and not extra.get("optional") for extra in inputs[1:]):
        return False
    output = first_output(metadata)
    if output is None or output.get("datatype") != "FP32":
        return False
    shape = output.get("shape")
    if not isinstance(shape, list) or not shape:
        return False
    return len(shape) == 2 if shape[0] == -1 else len(shape) == 1


# --- answers -------------------------------------------------------------------------------


def encode_embeddings(
    model: str,
    vectors: Sequence[np.ndarray],
    encoding_format: str,
    tokens: int,
    truncated: Sequence[bool] | None = None,
) -> bytes:
    """The ``POST /v1/embeddings`` answer: one embedding object per input, in order, and the
    usage (``prompt_tokens`` = ``total_tokens`` = ``tokens``). With ``truncated``, each
    embedding object also says whether the model cut its input (``"truncated"``, a field the
    SDK keeps as an extra)."""
    as_base64 = encoding_format == "base64" or encoding_format.endswith("+base64")
    data = []
    for index, vector in enumerate(vectors):
        entry: dict[str, object] = {
            "object": "embedding",
            "index": index,
            "embedding": encode_vector(vector, as_base64),
        }
        if truncated is not None:
            entry["truncated"] = bool(truncated[index])
        data.append(entry)
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def _model_object(name: str, created: int, extra: Mapping[str, object]) -> dict[str, object]:
    return {"id": name, "object": "model", "created": created, "owned_by": "batching", **extra}


def encode_models(models: Iterable[tuple[str, Mapping[str, object]]], created: int) -> bytes:
    """The ``GET /v1/models`` answer: each model's name and what else describes it."""
    return orjson.dumps(
        {"object": "list", "data": [_model_object(name, created, extra) for name, extra in models]}
    )


def encode_model(name: str, created: int, extra: Mapping[str, object]) -> bytes:
    """The ``GET /v1/models/{model}`` answer."""
    return orjson.dumps(_model_object(name, created, extra))


def error_document(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> bytes:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )
