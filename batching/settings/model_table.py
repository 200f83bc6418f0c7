"""One model's table of the repository (a folder's ``config.toml``, a ``[models.<name>]`` table
of a repository file, or a load call's ``config``): every key checked as it is read
(``docs/model-repository.md``), into a :class:`~batching.model_config.ModelConfig`. A bad key is a
:class:`RepositoryError` naming the file and the dotted key; an unknown one too."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from batching.core.batching_config import (
    MAX_BATCH_SIZE,
    MAX_BATCH_TOKENS,
    MAX_ITEMS_PER_REQUEST,
    MAX_QUEUE_SIZE,
    MAX_TIMEOUT,
)
from batching.model_config import (
    ENGINES,
    POLICIES,
    PRECISIONS,
    WARMUP_DATA,
    BatchingConfig,
    ModelConfig,
)
from batching.models.generation.prefix_cache import MAX_PREFIX_CACHE_MB
from batching.models.hub import HubId
from batching.models.source import ModelSource, ModelSourceError
from batching.runtime.cpus import InstanceBudget

from ._toml import MISSING, Table, is_int, show
from .instances import instance_devices

__all__ = ["RepositoryError", "model_from_table"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CLASS_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")

_TOP_KEYS = (
    "name",
    "source",
    "task",
    "version",
    "max_batch_size",
    "dynamic_batching",
    "queue_policy",
    "instance_group",
    "warmup",
    "engine",
    "precision",
    "truncate",
    "max_image_pixels",
    "max_decode_bytes",
    "max_audio_seconds",
    "prefix_cache_mb",
    "default_prompt_name",
    "default_prompt",
    "parameters",
    "cpu_share",
)


class RepositoryError(ValueError):
    """Raised when a model repository cannot be served; the message names file and key."""


def model_from_table(
    data: dict[str, object],
    *,
    file: str,
    folder: Path,
    default_name: str,
    path: str = "",
    own_folder: bool = False,
    defaults: ModelConfig | None = None,
    instances: InstanceBudget | None = None,
) -> ModelConfig:
    """One model's configuration from its parsed TOML table.

    :param file: the file, as messages should name it.
    :param folder: what relative paths resolve against.
    :param default_name: the name when the table has none.
    :param path: the table's dotted path in ``file`` ("" for a whole ``config.toml``).
    :param own_folder: ``folder`` is the model's own folder, served itself when it holds
        ``config.json`` and no source is given.
    :param defaults: values for keys the table leaves out (the command line's flags).
    :param instances: the budget the model's instances must fit (what the other models
        leave of it); None: no bound.
    :raises RepositoryError: naming ``file`` and the key at fault, and the bound it is over.
    """
    base = defaults or ModelConfig(name=default_name)
    base_batching = base.batching
    top = Table(data, file, path, raises=RepositoryError)

    name = top.string("name") or default_name
    if not _NAME.match(name):
        raise top.error(
            "name",
            "must be letters, digits, '.', '_' or '-', starting with a letter or digit"
            + ("" if "name" in data else " (it defaults to the folder name)"),
            name,
        )
    source = _source(top, folder, own_folder)
    task = top.string("task")
    if task is not None and (source is None or _CLASS_SPEC.match(source)):
        raise top.error("task", "applies only when source is a model folder", task)
    try:
        spec = ModelSource.parse(source, task)
    except ModelSourceError as exc:
        raise top.error("source", str(exc), source) from exc
    version = top.get("version")
    if version is MISSING:
        version = base.version
    elif is_int(version) and version >= 0:
        version = str(version)
    elif not isinstance(version, str) or not version or "/" in version:
        raise top.error("version", "must be a non-empty string without '/'", version)
    max_batch_size = top.integer(
        "max_batch_size", base_batching.max_batch_size, maximum=MAX_BATCH_SIZE
    )

    batching = _batching(top, base_batching, max_batch_size)
    devices, instance_kind = instance_devices(top, base, instances)
    warmup_sizes, warmup_data, warmup_file = _warmup(top, base, folder, max_batch_size)
    engine = top.choice("engine", ENGINES, base.engine)
    precision = top.choice("precision", PRECISIONS, base.precision)
    # Cut over-long texts (true) or refuse them with a 413 (false).
    truncate = top.boolean("truncate", base.truncate)
    max_image_pixels = top.integer("max_image_pixels", base.max_image_pixels)
    max_decode_bytes = top.integer("max_decode_bytes", base.max_decode_bytes)
    max_audio_seconds = top.number("max_audio_seconds", base.max_audio_seconds, positive=True)
    prefix_cache_mb = top.integer(
        "prefix_cache_mb", base.prefix_cache_mb, minimum=0, maximum=MAX_PREFIX_CACHE_MB
    )
    prompt_name, prompt = _prompt(top, base)
    parameters = _parameters(top, task)
    cpu_share = top.number("cpu_share", base.cpu_share, positive=True)
    top.finish(_TOP_KEYS)
    try:
        return ModelConfig(
            name=name,
            source=source,
            task=task,
            spec=spec,
            devices=devices,
            instance_kind=instance_kind,
            version=str(version),
            batching=batching,
            warmup_batch_sizes=warmup_sizes,
            warmup_data=warmup_data,
            warmup_file=warmup_file,
            engine=engine,
            precision=precision,
            engine_cache=base.engine_cache,
            truncate=truncate,
            max_image_pixels=max_image_pixels,
            max_decode_bytes=max_decode_bytes,
            max_audio_seconds=max_audio_seconds,
            prefix_cache_mb=prefix_cache_mb,
            default_prompt_name=prompt_name,
            default_prompt=prompt,
            parameters=parameters,
            cpu_share=cpu_share,
        )
    except ValueError as exc:  # cross-field rules the checks above do not cover
        raise RepositoryError(f"{file}: {path + ': ' if path else ''}{exc}") from exc


def _parameters(top: Table, task: str | None) -> tuple[tuple[str, Any], ...]:
    """``parameters``: a task's server-wide request parameters, as a table of values (checked
    against the task's declaration by ModelConfig; the message then names the key)."""
    table = top.table("parameters")
    if table is None:
        return ()
    if task is None:
        raise top.error("parameters", "applies only to a model served with a task")
    return tuple(sorted((str(key), _frozen(value)) for key, value in table.data.items()))


def _frozen(value: object) -> Any:
    """A TOML value as a hashable one (arrays become tuples)."""
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value


def _prompt(top: Table, base: ModelConfig) -> tuple[str | None, str | None]:
    """``default_prompt_name`` and ``default_prompt`` (a table that sets one drops the other's
    inherited value; setting both is refused when the model is configured)."""
    name = top.string("default_prompt_name")
    text = top.string("default_prompt", empty=True)
    if name is None and text is None:
        return base.default_prompt_name, base.default_prompt
    return name, text


def _source(top: Table, folder: Path, own_folder: bool) -> str | None:
    source = top.string("source")
    if source is None:
        if own_folder and (folder / "config.json").is_file():
            return str(folder.resolve())
        return None
    if source == "default":
        return None
    candidate = Path(source).expanduser()
    if not candidate.is_absolute():
        candidate = folder / candidate
    if candidate.is_dir():
        return str(candidate.resolve())
    if not _CLASS_SPEC.match(source) and HubId.parse(source) is None:
        raise top.error(
            "source",
            f'must be "default", a model folder (looked for {candidate}), "package.module:Name" '
            'or a Hugging Face Hub id "ORG/NAME[@REVISION]"',
            source,
        )
    return source


def _batching(top: Table, base: BatchingConfig, max_batch_size: int) -> BatchingConfig:
    dynamic = top.table("dynamic_batching")
    queue = top.table("queue_policy")
    delay_ms = base.max_queue_delay * 1000
    preferred = tuple(size for size in base.preferred_batch_sizes if size <= max_batch_size)
    policy, latency_ms, batch_tokens = base.policy, base.max_latency * 1000, base.max_batch_tokens
    if dynamic is not None:
        delay_ms = dynamic.number("max_queue_delay_ms", delay_ms)
        listed = dynamic.sizes("preferred_batch_size", max_batch_size)
        preferred = preferred if listed is None else listed
        policy = dynamic.choice("policy", POLICIES, policy)
        latency_ms = dynamic.number(
            "max_latency_ms", latency_ms, positive=True, maximum=MAX_TIMEOUT * 1000
        )
        tokens = dynamic.optional_integer("max_batch_tokens", maximum=MAX_BATCH_TOKENS)
        batch_tokens = batch_tokens if tokens is None else tokens
        dynamic.finish(
            (
                "max_queue_delay_ms",
                "preferred_batch_size",
                "policy",
                "max_latency_ms",
                "max_batch_tokens",
            )
        )
    queue_size, timeout_ms = base.max_queue_size, base.timeout * 1000
    items_per_request = base.max_items_per_request
    if queue is not None:
        queue_size = queue.integer("max_queue_size", queue_size, maximum=MAX_QUEUE_SIZE)
        timeout_ms = queue.number(
            "timeout_ms", timeout_ms, positive=True, maximum=MAX_TIMEOUT * 1000
        )
        items_per_request = queue.integer(
            "max_items_per_request", items_per_request, maximum=MAX_ITEMS_PER_REQUEST
        )
        queue.finish(("max_queue_size", "timeout_ms", "max_items_per_request"))
    if delay_ms >= timeout_ms:
        if dynamic is not None and "max_queue_delay_ms" in dynamic.data:
            raise dynamic.error(
                "max_queue_delay_ms",
                f"must be below the request timeout ({timeout_ms:g} ms)",
                dynamic.data["max_queue_delay_ms"],
            )
        assert queue is not None  # the inherited values were valid together
        raise queue.error(
            "timeout_ms",
            f"must be above the batch window ({delay_ms:g} ms)",
            queue.data["timeout_ms"],
        )
    return replace(
        base,
        max_batch_size=max_batch_size,
        max_queue_delay=delay_ms / 1000,
        preferred_batch_sizes=preferred,
        max_batch_tokens=batch_tokens,
        policy=policy,
        max_latency=latency_ms / 1000,
        max_queue_size=queue_size,
        timeout=timeout_ms / 1000,
        max_items_per_request=items_per_request,
    )


def _warmup(
    top: Table, base: ModelConfig, folder: Path, max_batch_size: int
) -> tuple[tuple[int, ...], str, str | None]:
    sizes = tuple(size for size in base.warmup_batch_sizes if size <= max_batch_size)
    data, file = base.warmup_data, base.warmup_file
    warmup = top.table("warmup")
    if warmup is None:
        return sizes, data, file
    listed = warmup.sizes("batch_sizes", max_batch_size)
    sizes = sizes if listed is None else listed
    given = warmup.get("data")
    file_value = warmup.string("file")
    if given is MISSING:
        data = "file" if file_value is not None else "model"
    else:
        data = warmup.choice("data", WARMUP_DATA, data)
    if data == "file":
        if file_value is None:
            raise warmup.error("file", 'is needed with data = "file"')
        candidate = Path(file_value).expanduser()
        if not candidate.is_absolute():
            candidate = folder / candidate
        if not candidate.is_file():
            raise warmup.error("file", f"no such file ({candidate})", file_value)
        file = str(candidate.resolve())
    elif file_value is not None:
        raise warmup.error("file", f'applies to data = "file" only, not {show(data)}')
    else:
        file = None
    warmup.finish(("batch_sizes", "data", "file"))
    return sizes, data, file
