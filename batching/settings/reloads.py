"""The repository as model control reads it at run time, and a load call's ``config``.

``--model-control-mode explicit`` re-reads the repository for each load call, and ``poll``
every ``--repository-poll-secs``: :func:`repository_reader` returns what
:class:`batching.control.ControlOptions` calls. A repository that cannot be served is an
:class:`~batching.errors.InvalidRequest` whose message names the file relative to the
repository (the full message goes to the log): an answer never names a path of the machine.

A load call's ``config`` overrides the file's settings for that one model
(:func:`apply_overrides`): the keys of ``docs/model-repository.md`` that say how the model is
batched and run. What the model *is* (``source``, ``task``) and files (``warmup``, which may
name one) stay the repository's: no request content is ever opened as a path. The call's
``config`` is read as a ``config.toml`` table is (:func:`~.model_table.model_from_table`), with
the same bounds: sizes within the core's limits, instances within what the instance budget
leaves beside the other models.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from batching.control import ReadRepository, RepositoryEntry
from batching.errors import InvalidRequest
from batching.model_config import ModelConfig
from batching.runtime.cpus import InstanceBudget

from .model_table import RepositoryError, model_from_table
from .repository import load_repository

__all__ = ["OVERRIDE_KEYS", "apply_overrides", "repository_reader", "source_stamp"]

logger = logging.getLogger("batching")

#: The keys a load call's ``config`` may set, as in a model's ``config.toml``.
OVERRIDE_KEYS = (
    "version",
    "max_batch_size",
    "dynamic_batching",
    "queue_policy",
    "instance_group",
    "engine",
    "precision",
    "truncate",
    "max_image_pixels",
    "max_decode_bytes",
    "prefix_cache_mb",
    "default_prompt_name",
    "default_prompt",
    "parameters",
    "cpu_share",
)


def source_stamp(config: ModelConfig) -> tuple[tuple[str, int, int], ...]:
    """The name, modification time and size of each file at the top of the model's folder
    (empty for a class or the packaged model): poll mode reloads a model whose files
    changed, even when its configuration did not."""
    source = config.source
    if source is None or not os.path.isdir(source):
        return ()
    stamps = []
    try:
        with os.scandir(source) as entries:
            for entry in entries:
                if entry.is_file():
                    stat = entry.stat()
                    stamps.append((entry.name, stat.st_mtime_ns, stat.st_size))
    except OSError:
        return ()
    return tuple(sorted(stamps))


def repository_reader(
    path: str, defaults: ModelConfig | None, instances: InstanceBudget | None = None
) -> ReadRepository:
    """Reads the repository at ``path`` afresh each time it is called, with ``defaults``
    (the command line's flags) for what a model leaves out, its models' instances together
    within ``instances`` (None: no bound)."""
    root = str(Path(path).resolve())

    def read() -> Sequence[RepositoryEntry]:
        try:
            models = load_repository(path, defaults=defaults, instances=instances)
        except RepositoryError as exc:
            logger.warning("model repository: %s", exc)
            message = str(exc).replace(root, "repository").replace(str(path), "repository")
            raise InvalidRequest(f"the model repository cannot be served: {message}") from None
        return [RepositoryEntry(model, source_stamp(model)) for model in models]

    return read


def apply_overrides(
    base: ModelConfig, overrides: Mapping[str, object], instances: InstanceBudget | None = None
) -> ModelConfig:
    """``base`` (the model as the repository has it) with a load call's ``config`` applied.

    :param instances: what the model's instances must fit (the budget, less what the other
        models take); None: no bound.
    :raises InvalidRequest: a key that may not be set, or a value the repository would
        refuse (over a bound included), named as ``config: <key>``.
    """
    table = dict(overrides)
    name = table.pop("name", base.name)
    if name != base.name:
        raise InvalidRequest(
            f"config: name: {name!r} is not the name of the model being loaded ({base.name!r})"
        )
    refused = sorted(key for key in table if key not in OVERRIDE_KEYS)
    if refused:
        raise InvalidRequest(
            f"config: {refused[0]}: cannot be set by a load call (the model's source, task "
            f"and files are the repository's); it may set {', '.join(OVERRIDE_KEYS)}"
        )
    # The model as the repository has it: its source and task (so that what depends on the
    # task is checked against it), and its task parameters unless the call sets its own.
    table["source"] = base.source if base.source is not None else "default"
    if base.task is not None:
        table["task"] = base.task
    if "parameters" not in table and base.parameters:
        table["parameters"] = dict(base.parameters)
    try:
        parsed = model_from_table(
            table,
            file="config",
            folder=Path("/"),
            default_name=base.name,
            defaults=base,
            instances=instances,
        )
    except RepositoryError as exc:
        message = str(exc)
        if message.startswith(("config: source", "config: task")):
            # The repository's own source, gone since it was read: the log says where.
            logger.warning("model %s: %s", base.name, message)
            message = f"config: the source of model {base.name!r} cannot be read now"
        raise InvalidRequest(message) from None
    return dataclasses.replace(parsed, name=base.name, spec=base.spec)
