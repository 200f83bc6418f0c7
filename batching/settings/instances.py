"""A model's ``instance_group``: its instances, one device each, held to the instance budget.

The same reading serves the repository's ``config.toml`` at start-up, the repository re-read
at run time and a load call's ``config``: each group's count is checked against what the
budget has left before a device is listed, so that no count, however large, allocates
anything (``count = 10000000`` is an error naming the key and the bound, at once).
"""

from __future__ import annotations

import os

from batching.model_config import INSTANCE_KINDS, ModelConfig
from batching.runtime.cpus import InstanceBudget

from ._toml import MISSING, Table, is_int, show

__all__ = ["instance_devices"]


def instance_devices(
    top: Table, base: ModelConfig, budget: InstanceBudget | None
) -> tuple[tuple[str, ...], str]:
    """The model's devices (one per instance) and how its instances run.

    :param base: what a table without ``instance_group`` inherits (the flags' instances).
    :param budget: what the model's instances must fit; None: no bound.
    :raises: ``top``'s error, naming the key (``instance_group[N].count`` for a count over
        the budget) and the bound.
    """
    groups = top.get("instance_group")
    if groups is MISSING:
        _fit(top, "instance_group", len(base.devices), 0, budget, inherited=True)
        return base.devices, base.instance_kind
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        raise top.error("instance_group", "must be an array of tables ([[instance_group]])")
    if not groups:
        raise top.error("instance_group", "needs at least one group")
    devices: list[str] = []
    kinds: list[str] = []
    for number, data in enumerate(groups):
        group = top.nested(data, f"{top.where('instance_group')}[{number}]")
        kind = group.choice("kind", ("cpu", "gpu"), "cpu")
        count_value = group.get("count")
        if count_value == "cpu_count":
            if kind != "cpu":
                raise group.error("count", '"cpu_count" applies to kind = "cpu" only', count_value)
            count = budget.cores if budget is not None else os.cpu_count() or 1
        elif count_value is MISSING:
            count = 1
        elif is_int(count_value) and count_value >= 1:
            count = count_value
        else:
            raise group.error("count", 'must be an integer >= 1 or "cpu_count"', count_value)
        gpus = _gpus(group, kind)
        _fit(group, "count", count * len(gpus), len(devices), budget, value=count_value)
        execution = group.choice("execution", INSTANCE_KINDS, base.instance_kind)
        if kinds and execution != kinds[0]:
            raise group.error(
                "execution",
                f"every group of a model must run the same way, and group 0 says {show(kinds[0])}",
                execution,
            )
        kinds.append(execution)
        group.finish(("count", "kind", "gpus", "execution"))
        devices.extend(
            "cpu" if kind == "cpu" else f"cuda:{gpu}" for gpu in gpus for _ in range(count)
        )
    return tuple(devices), kinds[0]


def _gpus(group: Table, kind: str) -> list[int]:
    """The GPUs a group's instances go on (one per instance on each); ``[0]`` for a CPU
    group, whose count counts once."""
    value = group.get("gpus")
    if value is MISSING:
        return [0]
    if kind != "gpu":
        raise group.error("gpus", 'applies to kind = "gpu" only', value)
    if not isinstance(value, list) or not value or not all(is_int(g) and g >= 0 for g in value):
        raise group.error("gpus", "must be a non-empty list of integers >= 0", value)
    return value


def _fit(
    table: Table,
    key: str,
    count: int,
    before: int,
    budget: InstanceBudget | None,
    *,
    value: object = MISSING,
    inherited: bool = False,
) -> None:
    """Refuse ``count`` more instances (after ``before`` of this model) over the budget."""
    if budget is None:
        return
    try:
        budget.beside(budget.used + before).check(count)
    except ValueError as exc:
        whence = " (inherited: the table leaves instance_group out)" if inherited else ""
        message = f"{before + count} instances{whence} do not fit: {exc}"
        raise table.error(key, message, value) from None
