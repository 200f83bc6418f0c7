"""The model repository: several models in one server, each described by TOML.

``--model-repository PATH`` names a directory with one folder per model, each holding a
``config.toml``, or one ``.toml`` file with a ``[models.<name>]`` table per model. The format,
in Triton's vocabulary, is documented in ``docs/model-repository.md``; every key is checked
(:mod:`.model_table`, one model's table) and a bad one stops the start-up with a message naming
the file and the dotted key. Here: the two layouts, and what holds across the models (each name
once, every model's instances within one budget).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

from batching.model_config import ModelConfig
from batching.runtime.cpus import InstanceBudget

from ._toml import show
from .model_table import RepositoryError, model_from_table

__all__ = ["CONFIG_FILE", "RepositoryError", "load_repository"]

#: The file each model folder of a repository directory holds.
CONFIG_FILE = "config.toml"


def _read_toml(file: Path) -> dict[str, object]:
    try:
        with file.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise RepositoryError(f"{file}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise RepositoryError(f"{file}: not UTF-8: {exc}") from exc
    except OSError as exc:
        raise RepositoryError(f"{file}: cannot be read: {exc.strerror or exc}") from exc


#: Reads one repository's models, each with the instance budget the ones before it leave.
_Reader = Callable[
    [Path, ModelConfig | None, Callable[[], InstanceBudget | None]],
    Iterator[tuple[str, ModelConfig]],
]


def _directory_models(
    root: Path, defaults: ModelConfig | None, room: Callable[[], InstanceBudget | None]
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
            instances=room(),
        )
        yield str(file), model


def _file_models(
    file: Path, defaults: ModelConfig | None, room: Callable[[], InstanceBudget | None]
) -> Iterator[tuple[str, ModelConfig]]:
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
                f"{file}: models.{name}: must be a table ([models.{name}]), got {show(table)}"
            )
        model = model_from_table(
            table,
            file=str(file),
            folder=file.parent,
            default_name=name,
            path=f"models.{name}",
            defaults=defaults,
            instances=room(),
        )
        yield f"{file} (models.{name})", model


def load_repository(
    path: str | os.PathLike[str],
    *,
    defaults: ModelConfig | None = None,
    instances: InstanceBudget | None = None,
) -> tuple[ModelConfig, ...]:
    """Every model of the repository at ``path``: a directory of model folders, or one
    ``.toml`` file (the module docstring describes both).

    :param defaults: values for keys a model leaves out (its ``name`` and ``source`` are
        ignored); the built-in defaults when None.
    :param instances: the budget every model's instances, together, must fit; None: no bound.
    :raises RepositoryError: for anything that cannot be served, naming file and key.
    """
    root = Path(path)
    read: _Reader
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

    def room() -> InstanceBudget | None:
        used = sum(len(model.devices) for model in models)
        return None if instances is None else instances.beside(instances.used + used)

    for where, model in read(root, defaults, room):
        if model.name in seen:
            raise RepositoryError(
                f"{where}: name: {show(model.name)} is already the name of the model in "
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
