"""A task's request parameters, as every door reads them: checked against what the model
declares (its metadata's ``parameters``, :mod:`batching.models.parameters`) and the
server-wide defaults (the model repository's ``parameters`` table), then attached to each
item as a :class:`~batching.models.parameters.TaskItem`.

An unknown key, a wrong type or a value out of range is a 400 naming the key, never a 200
with the option left out. A request that sets nothing, on a model with no defaults, sends its
inputs as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from batching.errors import InvalidRequest, NotReady
from batching.models.generation.grammars import check_constraint
from batching.models.items import Item
from batching.models.parameters import (
    PARAMETERS_KEY,
    InvalidParameter,
    TaskItem,
    check_parameters,
    declared_parameters,
)
from batching.runtime.deployment import Deployment

__all__ = ["declares_parameters", "list_values", "task_items"]


def declares_parameters(deployment: Deployment) -> bool:
    """Whether requests to ``deployment`` carry task parameters: its model declares some (or,
    before it has loaded, its configuration sets defaults for some)."""
    return bool(deployment.metadata.get(PARAMETERS_KEY)) or bool(deployment.config.parameters)


def task_items(
    deployment: Deployment, inputs: Sequence[Item], given: Mapping[str, object], *, where: str
) -> Sequence[Item]:
    """``inputs`` with the request's parameters (``given``) and the deployment's defaults,
    checked; the inputs as they are when neither sets any.

    :param where: where the parameters were sent, for messages ("the request's parameters").
    :raises InvalidRequest: an unknown key (the message lists the known ones), a wrong type,
        a value out of range, or a required parameter missing; the key is named.
    :raises NotReady: parameters sent before the model has said what it takes.
    """
    defaults = dict(deployment.config.parameters)
    if not given and not defaults:
        return inputs
    metadata = deployment.metadata
    if given and not metadata:
        raise NotReady(f"model {deployment.name!r} is loading", retry_after=1.0)
    if not metadata:
        # The defaults were checked against the task's declaration at start-up.
        checked = tuple(sorted(defaults.items()))
    else:
        try:
            checked = check_parameters(declared_parameters(metadata), given, defaults)
            check_constraint(dict(checked))
        except (InvalidParameter, ValueError) as exc:
            raise InvalidRequest(f"{where}: {exc}") from None
    if not checked:
        return inputs
    return [TaskItem(item, checked) for item in inputs]


def list_values(deployment: Deployment, given: Mapping[str, object]) -> dict[str, object]:
    """``given`` with a list parameter sent as one string holding a JSON array
    (``'["cat", "dog"]'``) read as that list: what a protocol whose parameters are scalars
    (KServe v2 over gRPC) sends for a list. Any other value is left as sent.

    :raises InvalidRequest: a string that starts with ``[`` and is not a JSON array of
        strings, for a list parameter.
    """
    declared = declared_parameters(deployment.metadata)
    read = dict(given)
    for key, value in given.items():
        param = declared.get(key)
        if param is None or param.type != "strings" or not isinstance(value, str):
            continue
        if not value.lstrip().startswith("["):
            continue
        try:
            listed = json.loads(value)
        except ValueError:
            listed = None
        if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
            raise InvalidRequest(
                f"parameter {key!r} must be a string or a JSON array of strings, not {value!r}"
            )
        read[key] = listed
    return read
