"""The parameters of the model repository extension's load and unload calls, whatever the
transport: Triton's ``config`` (a JSON model configuration, here the keys of a model's
``config.toml`` that a load may override) and ``unload_dependents``.

Triton also takes ``file:<path>`` parameters that carry model files in the call: refused, as
is any other parameter. A model's files come from the repository only.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from batching.documents import JSONObject, parse_object
from batching.errors import InvalidRequest

__all__ = ["load_overrides", "check_unload_parameters", "parameters_of"]


def parameters_of(body: bytes) -> JSONObject:
    """The ``parameters`` object of a load or unload call's JSON body (an empty body has
    none).

    :raises InvalidRequest: not a JSON object, or ``parameters`` not an object.
    """
    if not body.strip():
        return {}
    document = parse_object(
        body,
        lambda _: InvalidRequest("the request body is not valid JSON"),
        lambda _: InvalidRequest("the request body must be a JSON object"),
    )
    unknown = sorted(key for key in document if key != "parameters")
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: not a field of this call (only parameters)")
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidRequest("parameters: must be a JSON object")
    return parameters


def load_overrides(parameters: Mapping[str, object]) -> dict[str, object] | None:
    """The configuration a load call's ``config`` parameter overrides (a JSON object, or a
    string holding one as Triton's clients send it); None without one.

    :raises InvalidRequest: a model file, another parameter, or a config that is no object.
    """
    config: dict[str, object] | None = None
    for key, value in parameters.items():
        if key.startswith("file:"):
            raise InvalidRequest(
                f"{key}: this server takes no model files in a load call; a model's files "
                "come from its repository"
            )
        if key != "config":
            raise InvalidRequest(f"{key}: not a parameter of a load call (config)")
        if isinstance(value, str | bytes):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                raise InvalidRequest("config: not valid JSON") from None
        if not isinstance(value, dict):
            raise InvalidRequest("config: must be a JSON object of a model's settings")
        config = value
    return config


def check_unload_parameters(parameters: Mapping[str, object]) -> None:
    """An unload takes ``unload_dependents`` (a model here has none, so true and false are
    the same); nothing else.

    :raises InvalidRequest: another parameter, or not a boolean.
    """
    for key, value in parameters.items():
        if key != "unload_dependents":
            raise InvalidRequest(f"{key}: not a parameter of an unload call (unload_dependents)")
        if not isinstance(value, bool):
            raise InvalidRequest(f"unload_dependents: must be true or false, got {value!r}")
