"""The model repository: several models in one server, each described by a TOML file.

``--model-repository PATH`` (``BATCHING_MODEL_REPOSITORY``) names either

- a **directory** with one folder per model, each holding a ``config.toml`` (and, if you
  like, the model files themselves)::

      models/
      ├── minilm/
      │   └── config.toml
      └── sentiment/
          ├── config.toml
          ├── config.json          (a Hugging Face model folder: source may be omitted)
          └── model.safetensors

  Folders whose names start with ``.`` or ``__`` are skipped; any other folder without a
  ``config.toml`` is an error. Models are served in the order of their folder names; or

- a single **``.toml`` file** with one ``[models.<name>]`` table per model, each holding the
  keys of a ``config.toml``; models are served in the order of the file.

The first model also answers ``POST /``. Every key is optional; ``config.toml`` may be empty.

Top-level keys
    ``name`` (string): the name in URLs; default the folder name (or the table's name).
    Letters, digits, ``.``, ``_`` and ``-``.

    ``source`` (string): ``"default"`` for the packaged all-MiniLM-L6-v2; a model folder (a
    relative path resolves against the model's folder, or the ``.toml`` file's folder); or
    ``"package.module:Name"``, a class built with no arguments. Omitted: the model's folder
    itself when it holds ``config.json`` (a Hugging Face model folder), else the default model.

    ``task`` (string): the transformers pipeline task, for a model folder that is not a
    sentence-transformers folder (``text-classification``, ``fill-mask``, ...).

    ``version`` (string or integer): reported by the metadata endpoints; default ``"1"``.

    ``max_batch_size`` (integer >= 1): most items in one batch; default 32.

``[dynamic_batching]``
    ``max_queue_delay_ms`` (number >= 0): longest a forming batch waits; default 2.

    ``preferred_batch_size`` (list of integers in 1..max_batch_size): sizes that go out at
    once.

    ``policy`` (``"fixed"`` or ``"adaptive"``): the window above, or one adapted to traffic.

    ``max_latency_ms`` (number > 0): the adaptive policy's latency budget; default 100.

    ``max_batch_tokens`` (integer >= 1): cap on padded tokens per batch, for text models.

``[queue_policy]``
    ``max_queue_size`` (integer >= 1): most queued items; beyond it, 503. Default 2048.

    ``timeout_ms`` (number > 0): a request's deadline; beyond it, 504. Default 30000.

    ``max_items_per_request`` (integer >= 1): beyond it, 413. Default 1024.

``[[instance_group]]`` (an array: each group adds instances; default one CPU thread instance)
    ``count`` (integer >= 1, or ``"cpu_count"`` for one per core): instances per device.

    ``kind`` (``"cpu"`` or ``"gpu"``): default ``"cpu"``.

    ``gpus`` (list of integers >= 0, ``kind = "gpu"`` only): ``count`` instances on each
    listed GPU, as Triton does: ``count = 2, gpus = [0, 1]`` places them on cuda:0, cuda:0,
    cuda:1, cuda:1. Default ``[0]``. Whether CUDA exists is checked when an instance loads.

    ``execution`` (``"thread"`` or ``"process"``): threads share one interpreter (right for
    torch, which releases the GIL); processes each hold their own interpreter and model copy.
    Chosen per model: every group of a model must say the same. Default ``"thread"``.

``[warmup]`` (runs on every instance before the model reports ready)
    ``batch_sizes`` (list of integers in 1..max_batch_size): one batch of each size.
    Default: the model's own plan for ``data = "model"``, else 1 and max_batch_size.

    ``data``: ``"model"`` (default: the samples of the model's ``warmup_inputs``; for the
    built-in text models the longest input), ``"zero"`` (empty texts or zeros),
    ``"random"`` (random words as long as the model's ``max_seq_length``, or random
    numbers), or ``"file"``.

    ``file`` (string, implies ``data = "file"``): one input per line, UTF-8, cycled to fill
    each batch; text for text models, JSON otherwise; relative to the model's folder.

Command-line batching and instance flags (``--max-batch-size``, ``--device``,
``--instances``, ``--instance-kind``, ...) are the defaults for keys a model leaves out;
``--model``, ``--task`` and ``--name`` cannot be combined with a repository.

Any unknown key, wrong type or out-of-range value raises :class:`RepositoryError`, whose
message names the file and the dotted key, e.g.
``models/minilm/config.toml: dynamic_batching.max_queue_delay_ms: must be a number >= 0,
got -1``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import INSTANCE_KINDS, POLICIES, WARMUP_DATA, BatchingConfig, ModelConfig

__all__ = ["RepositoryError", "load_repository", "model_from_table"]

#: The file each model folder of a repository directory holds.
CONFIG_FILE = "config.toml"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CLASS_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
_MISSING: Any = object()

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
)


class RepositoryError(ValueError):
    """Raised when a model repository cannot be served; the message names file and key."""


def _show(value: Any) -> str:
    """A value as the TOML file spells it, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(item) for item in value) + "]"
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def _is_int(value: Any) -> bool:
    # TOML booleans arrive as Python bools, which are ints too.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


class _Table:
    """One TOML table being read: every key is checked as it is taken, and any key left
    over at :meth:`finish` is unknown."""

    def __init__(self, data: dict[str, Any], file: str, path: str) -> None:
        self.data = data
        self.file = file
        self.path = path
        self.taken: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str, value: Any = _MISSING) -> RepositoryError:
        got = "" if value is _MISSING else f", got {_show(value)}"
        return RepositoryError(f"{self.file}: {self.where(key)}: {message}{got}")

    def get(self, key: str) -> Any:
        self.taken.add(key)
        return self.data.get(key, _MISSING)

    def integer(self, key: str, default: int) -> int:
        value = self.optional_integer(key)
        return default if value is None else value

    def optional_integer(self, key: str) -> int | None:
        value = self.get(key)
        if value is _MISSING:
            return None
        if not _is_int(value) or value < 1:
            raise self.error(key, "must be an integer >= 1", value)
        return int(value)

    def number(self, key: str, default: float, *, positive: bool = False) -> float:
        value = self.get(key)
        if value is _MISSING:
            return default
        ok = _is_number(value) and (value > 0 if positive else value >= 0)
        if not ok:
            raise self.error(key, f"must be a number {'> 0' if positive else '>= 0'}", value)
        return float(value)

    def string(self, key: str) -> str | None:
        value = self.get(key)
        if value is _MISSING:
            return None
        if not isinstance(value, str) or not value:
            raise self.error(key, "must be a non-empty string", value)
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(key)
        if value is _MISSING:
            return default
        if value not in choices:
            listed = ", ".join(json.dumps(choice) for choice in choices)
            raise self.error(key, f"must be one of {listed}", value)
        return str(value)

    def sizes(self, key: str, maximum: int | None = None) -> tuple[int, ...] | None:
        value = self.get(key)
        if value is _MISSING:
            return None
        if not isinstance(value, list) or not all(_is_int(item) for item in value):
            raise self.error(key, "must be a list of integers", value)
        for item in value:
            if item < 1 or (maximum is not None and item > maximum):
                bound = f"between 1 and max_batch_size ({maximum})" if maximum else ">= 1"
                raise self.error(key, f"every size must be {bound}", value)
        return tuple(value)

    def table(self, key: str) -> _Table | None:
        value = self.get(key)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table ([{self.where(key)}])", value)
        return _Table(value, self.file, self.where(key))

    def finish(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in self.taken:
                raise self.error(key, f"unknown key (known here: {', '.join(allowed)})")


def model_from_table(
    data: dict[str, Any],
    *,
    file: str,
    folder: Path,
    default_name: str,
    path: str = "",
    own_folder: bool = False,
    defaults: ModelConfig | None = None,
) -> ModelConfig:
    """One model's configuration from its parsed TOML table.

    :param file: the file, as messages should name it.
    :param folder: what relative paths resolve against.
    :param default_name: the name when the table has none.
    :param path: the table's dotted path in ``file`` ("" for a whole ``config.toml``).
    :param own_folder: ``folder`` is the model's own folder, served itself when it holds
        ``config.json`` and no source is given.
    :param defaults: values for keys the table leaves out (the command line's flags).
    :raises RepositoryError: naming ``file`` and the key at fault.
    """
    base = defaults or ModelConfig(name=default_name)
    base_batching = base.batching
    top = _Table(data, file, path)

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
    version = top.get("version")
    if version is _MISSING:
        version = base.version
    elif _is_int(version) and version >= 0:
        version = str(version)
    elif not isinstance(version, str) or not version or "/" in version:
        raise top.error("version", "must be a non-empty string without '/'", version)
    max_batch_size = top.integer("max_batch_size", base_batching.max_batch_size)

    batching = _batching(top, base_batching, max_batch_size)
    devices, instance_kind = _instances(top, base)
    warmup_sizes, warmup_data, warmup_file = _warmup(top, base, folder, max_batch_size)
    top.finish(_TOP_KEYS)
    try:
        return ModelConfig(
            name=name,
            source=source,
            task=task,
            devices=devices,
            instance_kind=instance_kind,
            version=str(version),
            batching=batching,
            warmup_batch_sizes=warmup_sizes,
            warmup_data=warmup_data,
            warmup_file=warmup_file,
        )
    except ValueError as exc:  # cross-field rules the checks above do not cover
        raise RepositoryError(f"{file}: {path + ': ' if path else ''}{exc}") from exc


def _source(top: _Table, folder: Path, own_folder: bool) -> str | None:
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
    if not _CLASS_SPEC.match(source):
        raise top.error(
            "source",
            f'must be "default", a model folder (looked for {candidate}) or "package.module:Name"',
            source,
        )
    module = source.partition(":")[0]
    try:
        # Finds the module without running it (only its parent packages are imported).
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise top.error("source", f"no module {module!r} can be imported", source)
    return source


def _batching(top: _Table, base: BatchingConfig, max_batch_size: int) -> BatchingConfig:
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
        latency_ms = dynamic.number("max_latency_ms", latency_ms, positive=True)
        tokens = dynamic.optional_integer("max_batch_tokens")
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
        queue_size = queue.integer("max_queue_size", queue_size)
        timeout_ms = queue.number("timeout_ms", timeout_ms, positive=True)
        items_per_request = queue.integer("max_items_per_request", items_per_request)
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


def _instances(top: _Table, base: ModelConfig) -> tuple[tuple[str, ...], str]:
    groups = top.get("instance_group")
    if groups is _MISSING:
        return base.devices, base.instance_kind
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        raise top.error("instance_group", "must be an array of tables ([[instance_group]])")
    if not groups:
        raise top.error("instance_group", "needs at least one group")
    devices: list[str] = []
    kinds: list[str] = []
    for number, data in enumerate(groups):
        group = _Table(data, top.file, f"{top.where('instance_group')}[{number}]")
        kind = group.choice("kind", ("cpu", "gpu"), "cpu")
        count_value = group.get("count")
        if count_value == "cpu_count":
            if kind != "cpu":
                raise group.error("count", '"cpu_count" applies to kind = "cpu" only', count_value)
            count = os.cpu_count() or 1
        elif count_value is _MISSING:
            count = 1
        elif _is_int(count_value) and count_value >= 1:
            count = count_value
        else:
            raise group.error("count", 'must be an integer >= 1 or "cpu_count"', count_value)
        gpus_value = group.get("gpus")
        if gpus_value is _MISSING:
            gpus = [0]
        elif kind != "gpu":
            raise group.error("gpus", 'applies to kind = "gpu" only', gpus_value)
        elif (
            not isinstance(gpus_value, list)
            or not gpus_value
            or not all(_is_int(gpu) and gpu >= 0 for gpu in gpus_value)
        ):
            raise group.error("gpus", "must be a non-empty list of integers >= 0", gpus_value)
        else:
            gpus = gpus_value
        execution = group.choice("execution", INSTANCE_KINDS, base.instance_kind)
        if kinds and execution != kinds[0]:
            raise group.error(
                "execution",
                f"every group of a model must run the same way, and group 0 says {_show(kinds[0])}",
                execution,
            )
        kinds.append(execution)
        group.finish(("count", "kind", "gpus", "execution"))
        if kind == "cpu":
            devices.extend("cpu" for _ in range(count))
        else:
            devices.extend(f"cuda:{gpu}" for gpu in gpus for _ in range(count))
    return tuple(devices), kinds[0]


def _warmup(
    top: _Table, base: ModelConfig, folder: Path, max_batch_size: int
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
    if given is _MISSING:
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
        raise warmup.error("file", f'applies to data = "file" only, not {_show(data)}')
    else:
        file = None
    warmup.finish(("batch_sizes", "data", "file"))
    return sizes, data, file


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise RepositoryError(f"{file}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise RepositoryError(f"{file}: not UTF-8: {exc}") from exc
    except OSError as exc:
        raise RepositoryError(f"{file}: cannot be read: {exc.strerror or exc}") from exc


def _directory_models(
    root: Path, defaults: ModelConfig | None
) -> Iterator[tuple[str, ModelConfig]]:
    if (root / CONFIG_FILE).is_file():
        raise RepositoryError(
            f"{root}: holds {CONFIG_FILE} itself; a repository holds one folder per model, "
            "so point at the folder above it"
        )
    folders = sorted(
        entry
        for entry in root.iterdir()
        if entry.is_dir() and not entry.name.startswith((".", "__"))
    )
    for folder in folders:
        file = folder / CONFIG_FILE
        if not file.is_file():
            raise RepositoryError(
                f"{folder}: no {CONFIG_FILE} (each folder of a model repository is one model)"
            )
        model = model_from_table(
            _read_toml(file),
            file=str(file),
            folder=folder,
            default_name=folder.name,
            own_folder=True,
            defaults=defaults,
        )
        yield str(file), model


def _file_models(file: Path, defaults: ModelConfig | None) -> Iterator[tuple[str, ModelConfig]]:
    data = _read_toml(file)
    for key in data:
        if key != "models":
            raise RepositoryError(
                f"{file}: {key}: unknown key (a repository file holds only [models.<name>] tables)"
            )
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise RepositoryError(f"{file}: models: must be a table of [models.<name>] tables")
    for name, table in models.items():
        if not isinstance(table, dict):
            raise RepositoryError(
                f"{file}: models.{name}: must be a table ([models.{name}]), got {_show(table)}"
            )
        model = model_from_table(
            table,
            file=str(file),
            folder=file.parent,
            default_name=name,
            path=f"models.{name}",
            defaults=defaults,
        )
        yield f"{file} (models.{name})", model


def load_repository(
    path: str | os.PathLike[str], *, defaults: ModelConfig | None = None
) -> tuple[ModelConfig, ...]:
    """Every model of the repository at ``path``: a directory of model folders, or one
    ``.toml`` file (the module docstring describes both).

    :param defaults: values for keys a model leaves out (its ``name`` and ``source`` are
        ignored); the built-in defaults when None.
    :raises RepositoryError: for anything that cannot be served, naming file and key.
    """
    root = Path(path)
    read: Callable[[Path, ModelConfig | None], Iterator[tuple[str, ModelConfig]]]
    if root.is_dir():
        read = _directory_models
    elif root.is_file() and root.suffix == ".toml":
        read = _file_models
    elif root.exists():
        raise RepositoryError(f"{root}: a model repository is a directory or a .toml file")
    else:
        raise RepositoryError(f"{root}: no such directory or file")
    seen: dict[str, str] = {}
    models: list[ModelConfig] = []
    for where, model in read(root, defaults):
        if model.name in seen:
            raise RepositoryError(
                f"{where}: name: {_show(model.name)} is already the name of the model in "
                f"{seen[model.name]}"
            )
        seen[model.name] = where
        models.append(model)
    if not models:
        raise RepositoryError(
            f"{root}: no models (add a folder with a {CONFIG_FILE} per model)"
            if root.is_dir()
            else f"{root}: no models (add a [models.<name>] table per model)"
        )
    return tuple(models)
