"""What to serve: one model's configuration, validated (and its source parsed) once at
construction, never at request time."""

from __future__ import annotations

from dataclasses import dataclass, field

from batching.core.batching_config import POLICIES, BatchingConfig
from batching.models.embedding.prompts import PromptOptions
from batching.models.engines.engine_options import (
    ENGINES,
    PRECISIONS,
    EngineOptions,
    check_engine_settings,
)
from batching.models.generation.prefix_cache import DEFAULT_PREFIX_CACHE_MB, MAX_PREFIX_CACHE_MB
from batching.models.media import (
    DEFAULT_MAX_DECODE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_IMAGE_PIXELS_CAP,
    MediaLimits,
)
from batching.models.parameters import InvalidParameter, Parameters
from batching.models.source import ModelSource
from batching.models.tasks.audio import DEFAULT_MAX_SECONDS
from batching.models.tasks.table import check_defaults

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
#: The highest ``cpu_share``: weights beyond it would make a model's share of two cores
#: round to a whole machine anyway.
MAX_CPU_SHARE = 1000.0
#: The highest ``max_audio_seconds``: an hour (a batch of such audio would not fit anyway).
MAX_AUDIO_SECONDS = 3600.0
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
    #: Image inputs: the most pixels (width x height) an image may have, read from its header
    #: before it is decoded; more is a 413 (``--max-image-pixels``).
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    #: Image inputs: the most memory, in bytes, one image may take to decode and prepare for
    #: the model, estimated from its header before it is decoded; more is a 413
    #: (``--max-decode-bytes``).
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES
    #: Audio inputs: the longest audio, in seconds, read from its header before it is
    #: decoded (or counted from samples sent as numbers); more is a 413
    #: (``--max-audio-seconds``).
    max_audio_seconds: float = DEFAULT_MAX_SECONDS
    #: text-generation: the most memory, in MiB, each instance's prompt prefixes may hold for
    #: later prompts that start with them (``--prefix-cache-mb``; 0: none kept).
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB
    #: A task's server-wide request parameters (the model repository's ``parameters``
    #: table): what a request that does not set one gets. Checked against the task's
    #: declaration at construction; stored checked, sorted by name.
    parameters: Parameters = ()
    #: This model's weight when several models compute at once: its threads are the cores
    #: times its share over the shares of the models busy then
    #: (:mod:`batching.models.engines.cores`).
    cpu_share: float = 1.0
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

    @property
    def media_limits(self) -> MediaLimits:
        """What media inputs are checked against before they are queued."""
        return MediaLimits(
            max_image_pixels=self.max_image_pixels,
            max_audio_seconds=self.max_audio_seconds,
            max_decode_bytes=self.max_decode_bytes,
        )

    def _validate(self) -> None:
        if not 1 <= self.max_image_pixels <= MAX_IMAGE_PIXELS_CAP:
            raise ValueError(
                f"max_image_pixels must be between 1 and {MAX_IMAGE_PIXELS_CAP} (Pillow's "
                f"decompression-bomb limit), not {self.max_image_pixels}"
            )
        if self.max_decode_bytes < 1 << 20:
            raise ValueError(
                f"max_decode_bytes must be at least {1 << 20} (1 MiB), not {self.max_decode_bytes}"
            )
        if not 0 < self.max_audio_seconds <= MAX_AUDIO_SECONDS:
            raise ValueError(
                f"max_audio_seconds must be above 0 and at most {MAX_AUDIO_SECONDS:g}, "
                f"not {self.max_audio_seconds}"
            )
        if not 0 <= self.prefix_cache_mb <= MAX_PREFIX_CACHE_MB:
            raise ValueError(
                f"prefix_cache_mb must be between 0 and {MAX_PREFIX_CACHE_MB}, "
                f"not {self.prefix_cache_mb}"
            )
        if not 0 < self.cpu_share <= MAX_CPU_SHARE:
            raise ValueError(
                f"cpu_share must be above 0 and at most {MAX_CPU_SHARE:g}, not {self.cpu_share}"
            )
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
        if self.parameters:
            if spec.kind != "pipeline" or spec.task is None:
                raise ValueError(
                    "parameters: apply to a model folder served with a task (--task); "
                    f"{spec.describe()} declares none"
                )
            try:
                checked = check_defaults(spec.task, dict(self.parameters))
            except InvalidParameter as exc:
                raise ValueError(f"parameters: {exc}") from None
            object.__setattr__(self, "parameters", checked)
