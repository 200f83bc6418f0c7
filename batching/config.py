"""What to serve: one model's configuration, validated (and its source parsed) once at
construction, never at request time."""

from __future__ import annotations

from dataclasses import dataclass, field

from batching.core.config import POLICIES, BatchingConfig
from batching.models.engines.options import (
    ENGINES,
    PRECISIONS,
    EngineOptions,
    check_engine_settings,
)
from batching.models.prompts import PromptOptions
from batching.models.source import ModelSource

__all__ = [
    "ENGINES",
    "INSTANCE_KINDS",
    "POLICIES",
    "PRECISIONS",
    "WARMUP_DATA",
    "BatchingConfig",
    "ModelConfig",
]

INSTANCE_KINDS = ("thread", "process")
#: Where warm-up inputs come from: the model's own samples, zeros, random data or a file.
WARMUP_DATA = ("model", "zero", "random", "file")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served model: where it comes from, where it runs, how it is batched."""

    #: The name clients use in URLs (``/v2/models/{name}``).
    name: str
    #: A ``package.module:Name`` class, a local model folder, or None for the default model.
    source: str | None = None
    #: A transformers pipeline task, for a model folder that is not a sentence embedder.
    task: str | None = None
    #: One device per instance ("cpu", "cuda:0", ...): ``("cpu", "cpu")`` is two CPU instances.
    devices: tuple[str, ...] = ("cpu",)
    #: "thread" (the model releases the GIL, as torch does) or "process" (its own interpreter).
    instance_kind: str = "thread"
    #: Version string reported by the v2 metadata endpoints.
    version: str = "1"
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    #: Warm-up: run these batch sizes before ready; empty means 1 and max_batch_size.
    warmup_batch_sizes: tuple[int, ...] = ()
    #: Warm-up inputs: "model" (its ``warmup_inputs``), "zero", "random" or "file".
    warmup_data: str = "model"
    #: With ``warmup_data="file"``: a UTF-8 file holding one input per line.
    warmup_file: str | None = None
    #: What runs the model: "auto" (measured at start-up), "torch", "onnxruntime", "openvino".
    engine: str = "auto"
    #: "auto" (bf16 where it is faster and as accurate), "fp32", "bf16", "fp16" (GPU only).
    precision: str = "auto"
    #: Where exported engines and start-up measurements are kept; None: the default folder
    #: (``$BATCHING_ENGINE_CACHE``, ``$XDG_CACHE_HOME/batching/engines``, ``~/.cache/...``).
    engine_cache: str | None = None
    #: Embedding models: cut texts longer than the model's maximum length (True), or refuse
    #: them with a 413 unless a request sends ``truncate: true`` (False, ``--no-truncate``).
    truncate: bool = True
    #: The default prompt of a sentence embedder, by name (one of its folder's ``prompts``),
    #: overriding the folder's ``default_prompt_name``; exclusive with ``default_prompt``.
    default_prompt_name: str | None = None
    #: A literal default prompt ("" for none), overriding the folder's.
    default_prompt: str | None = None
    #: ``source`` and ``task`` parsed (at construction, once); pass one already parsed to
    #: skip the parse.
    spec: ModelSource | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.spec is None:
            # Raises ModelSourceError (a ValueError) naming what is wrong and how to fix it.
            object.__setattr__(self, "spec", ModelSource.parse(self.source, self.task))
        self._validate()

    @property
    def model_source(self) -> ModelSource:
        """The parsed ``source`` and ``task``."""
        assert self.spec is not None  # set by __post_init__
        return self.spec

    @property
    def engine_options(self) -> EngineOptions:
        """What the model's engine selection is told (picklable, for process instances)."""
        return EngineOptions(
            engine=self.engine,
            precision=self.precision,
            cache_dir=self.engine_cache,
            batch_sizes=tuple(sorted({1, self.batching.max_batch_size})),
            model_name=self.name,
            apart=True,
        )

    @property
    def prompt_options(self) -> PromptOptions | None:
        """The default prompt override handed to the model, None when neither is set."""
        if self.default_prompt_name is None and self.default_prompt is None:
            return None
        return PromptOptions(name=self.default_prompt_name, text=self.default_prompt)

    def _validate(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"name: {self.name!r} must be non-empty and contain no '/'")
        if not self.devices:
            raise ValueError("devices: at least one instance is needed")
        if self.instance_kind not in INSTANCE_KINDS:
            raise ValueError(
                f"instance_kind must be 'thread' or 'process', not {self.instance_kind!r}"
            )
        for size in self.warmup_batch_sizes:
            if size < 1:
                raise ValueError("warmup_batch_sizes must be >= 1")
            if size > self.batching.max_batch_size:
                # A warm-up batch larger than any real batch warms a shape never served.
                raise ValueError(
                    f"warmup_batch_sizes: {size} is over max_batch_size "
                    f"({self.batching.max_batch_size})"
                )
        if self.warmup_data not in WARMUP_DATA:
            raise ValueError(
                f"warmup_data must be one of {', '.join(WARMUP_DATA)}, not {self.warmup_data!r}"
            )
        if (self.warmup_data == "file") != (self.warmup_file is not None):
            raise ValueError('warmup_file is required with warmup_data="file", and only then')
        spec = self.model_source
        # Raises EngineConfigError (a ValueError): one line saying what to do.
        check_engine_settings(
            self.engine,
            self.precision,
            task=spec.task,
            custom=spec.kind == "class",
            devices=self.devices,
        )
        # Raises PromptConfigError (a ValueError): one line naming the known prompts.
        spec.check_prompts(self.prompt_options)
