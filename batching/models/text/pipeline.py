"""The text tasks of the task table, each through its transformers pipeline, served from a
local model folder, with the request parameters each declares applied."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import BatchEncoding, PreTrainedTokenizerBase
from transformers.pipelines.base import PipelineException

from batching.errors import UnprocessableInput

from ..engines.engine_options import EngineOptions
from ..engines.job import EngineJob
from ..engines.logits import LogitsModel, mask_logits, scores
from ..engines.measure import grown_mb, resident_mb
from ..engines.plan import EnginePlan
from ..engines.selection import select_engine
from ..parameters import PARAMETERS_KEY, Param, TaskItem, group_by_parameters
from ..protocol import warmup_batches
from ..shared.text_models import DEFAULT_MAX_LENGTH, LazyCounter
from ..shared.torch_models import (
    WEIGHTS_LOADING,
    calibration_texts,
    encode,
    encode_and_run,
    mean_pool,
    read_config,
    require_strings,
    resolve_device,
    to_numpy,
    warmup_text,
)
from ..tasks.table import declared as declared_parameters
from ..tasks.table import resolve_task
from .pipeline_io import (
    TextPipeline,
    classifiable,
    input_of,
    is_one_per_input,
    jsonable,
    labels_of,
    pair_of,
    per_item_postprocess,
    pipeline_value,
)

__all__ = ["PipelineModel"]

#: The tasks another engine may serve: what is exported, and the accuracy check.
_ENGINE_TASKS = {
    "feature-extraction": ("base", "embedding"),
    "text-classification": ("sequence-classification", "classification"),
    "fill-mask": ("masked-lm", "fill-mask"),
}

# Tasks whose inputs are plain strings: they get truncation, token counts and a text warm-up.
_TEXT_TASKS = frozenset(
    {
        "feature-extraction",
        "fill-mask",
        "text-classification",
        "token-classification",
    }
)


class PipelineModel:
    """A text task of the task table (:mod:`batching.models.tasks.table`), served from a local
    model folder through its ``transformers.pipeline``.

    ``predict`` runs the batch through the pipeline in one call per group of items whose
    parameters change the forward pass (none of the text tasks' do), each item post-processed
    with its own request parameters (:mod:`batching.models.tasks.text`), and returns one
    JSON-ready output per input, as ``pipeline(...)(text, **parameters)`` answers it:

    - ``text-classification`` (alias ``sentiment-analysis``): ``{"label": str, "score": float}``
      per input (a list of those when ``top_k`` is passed). An input is a text, or a text pair
      ``{"text": a, "text_pair": b}`` (cross-encoders, NLI), which the model reads as one
      sequence pair; its metadata declares the inputs ``text`` and an optional ``text_pair``,
      and its ``labels`` in the model's order.
    - ``fill-mask``: a list of ``{"score", "token", "token_str", "sequence"}`` candidates per
      input (a list of such lists when an input has several mask tokens).
    - ``feature-extraction``: one mean-pooled, unnormalised sentence vector per input, as rows of
      a float32 array. A sentence vector is what callers of a serving endpoint want; token-level
      arrays would be large and ragged. This task runs the pipeline's own tokenizer and model
      directly instead of the pipeline call, because the pipeline hands back batched token
      rows padded to the longest input and drops the attention mask, so pooling them would
      make each vector depend on what it was batched with.
    - ``token-classification`` (alias ``ner``): a list of tokens (``{"entity", "score",
      "index", "word", "start", "end"}``), or of entities with ``aggregation_strategy``.

    Text inputs are truncated to the model's maximum length instead of failing on long input
    (a pair longest-first, as the tokenizer's ``truncation=True`` does).

    :param task: a task of the table (validated now, so a typo fails at start-up).
    :param path: the local model folder (weights, config and tokenizer).
    :param engine: what computes the logits (or hidden states) for feature-extraction,
        text-classification and fill-mask (:mod:`batching.models.engines`); the pipeline's
        pre- and post-processing stay the same. Other tasks run on torch. None: torch, fp32.
    :param pipeline_kwargs: passed to ``transformers.pipeline`` (e.g. ``top_k=3``).
    """

    def __init__(
        self,
        task: str,
        path: str | os.PathLike[str],
        engine: EngineOptions | None = None,
        **pipeline_kwargs: object,
    ) -> None:
        # Raises UnknownTask (a ValueError) for a task the table does not serve.
        self.task = resolve_task(task)
        #: The request parameters the task takes (:mod:`batching.models.tasks`).
        self.parameters: dict[str, Param] = declared_parameters(self.task)
        #: Those that change the post-processing alone: items differing in them share a pass.
        self._neutral = frozenset(name for name, p in self.parameters.items() if p.batch_neutral)
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"model folder {str(self.path)!r} does not exist")
        self.name = self.path.resolve().name
        self.pipeline_kwargs = pipeline_kwargs
        self.is_text = self.task in _TEXT_TASKS
        #: Whether an input may be a text pair ``{"text": a, "text_pair": b}``.
        self.takes_pairs = self.task == "text-classification"
        self.engine = engine or EngineOptions(engine="torch", precision="fp32")
        self._pipeline: TextPipeline | None = None
        self._plan: EnginePlan | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._device = torch.device("cpu")
        #: The longest text input in tokens (:func:`~..shared.text_models.max_length_of`, once
        #: loaded).
        self.max_seq_length = DEFAULT_MAX_LENGTH
        self._counter = LazyCounter(self.path)
        config_path = self.path / "config.json"
        self._config = read_config(config_path) if config_path.is_file() else {}
        problem = self._config.get("problem_type")
        self._problem_type = problem if isinstance(problem, str) else None

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        kwargs = dict(self.pipeline_kwargs)
        if self.is_text:
            kwargs.setdefault("tokenizer", str(self.path))
        before = resident_mb()
        # The task is a str checked against the task table at construction; transformers'
        # overloads only accept each task name as a literal (the implementation takes str).
        with WEIGHTS_LOADING:
            pipe = transformers.pipeline(  # type: ignore[call-overload]
                self.task, model=str(self.path), device=self._device, **kwargs
            )
        pipe.model.eval()
        tokenizer: PreTrainedTokenizerBase | None = getattr(pipe, "tokenizer", None)
        if tokenizer is not None:
            self.max_seq_length = self._counter.resolve(tokenizer, self._config)
            if self.task == "token-classification":
                # Its pipeline truncates at the tokenizer's model_max_length alone, which a
                # folder may leave unset: a long text would overflow the position table.
                tokenizer.model_max_length = self.max_seq_length
        head, measure = _ENGINE_TASKS.get(self.task, ("base", None))
        original = pipe.model
        self._pipeline, self._tokenizer = pipe, tokenizer
        self._plan = select_engine(
            EngineJob(
                options=self.engine,
                folder=self.path,
                head=head,
                measure=measure if tokenizer is not None else None,
                device=str(self._device),
                input_names=(
                    tuple(tokenizer(["a"], return_tensors="pt").keys()) if tokenizer else ()
                ),
                load_reference=lambda: original,
                view=self._view,
                calibration=self._calibration,
                sample=self._sample,
                reference_mb=grown_mb(before),
            )
        )
        if self.task in _ENGINE_TASKS:
            pipe.model = LogitsModel(self._plan, original, self.task)

    def _encode(self, texts: list[str], pairs: list[str] | None = None) -> BatchEncoding:
        if self._tokenizer is None:
            raise RuntimeError(f"{self.task}: this model has no tokenizer")
        return encode(self._tokenizer, texts, self.max_seq_length, self._device, pairs)

    def _mask(self) -> str:
        mask: str | None = getattr(self._tokenizer, "mask_token", None)
        if mask is None:
            raise ValueError(f"{self.path}: the tokenizer has no mask token for fill-mask")
        return mask

    def _calibration(self) -> list[BatchEncoding]:
        prefix = f"{self._mask()} " if self.task == "fill-mask" else ""
        texts = calibration_texts(min(self.max_seq_length, 512) - 8, prefix)
        batches = [self._encode(texts), self._encode(texts[-1:])]
        if self.takes_pairs:
            batches.append(self._encode(texts, list(reversed(texts))))
        return batches

    def _sample(self, size: int) -> BatchEncoding:
        prefix = f"{self._mask()} " if self.task == "fill-mask" else ""
        return self._encode([prefix + warmup_text(self.max_seq_length)] * size)

    def _view(self, output: torch.Tensor, encoded: BatchEncoding) -> np.ndarray:
        output = torch.as_tensor(output)  # ONNX Runtime and OpenVINO answer in numpy
        if self.task == "text-classification":
            return scores(self._problem_type, output)
        if self.task == "fill-mask":
            assert self._tokenizer is not None  # the engine is checked on its tokens
            return mask_logits(self._tokenizer.mask_token_id, output, encoded["input_ids"])
        with torch.inference_mode():
            return to_numpy(mean_pool(output, encoded["attention_mask"]))

    def _call_kwargs(self) -> dict[str, object]:
        """Truncation for the tasks that accept tokenizer options, unless the user set them."""
        truncate: dict[str, object] = {"truncation": True, "max_length": self.max_seq_length}
        if self.task == "text-classification" and "truncation" not in self.pipeline_kwargs:
            return truncate
        if self.task == "fill-mask" and "tokenizer_kwargs" not in self.pipeline_kwargs:
            return {"tokenizer_kwargs": truncate}
        return {}

    def unload(self) -> None:
        """Stop the engine plan's background threads (idle release, retake)."""
        if self._plan is not None:
            self._plan.close()

    def predict(self, inputs: Sequence[object]) -> list[object] | np.ndarray:
        """One output per input. An input is a plain input, or a :class:`TaskItem` with its
        request's parameters: items whose parameters change the forward pass run as groups of
        their own; the others share it, and each is post-processed with its own."""
        if self._pipeline is None:
            raise RuntimeError("PipelineModel.predict called before load()")
        if not inputs:
            return []
        if self.task == "feature-extraction":
            return self._embed([input_of(item) for item in inputs])
        outputs: list[object] = [None] * len(inputs)
        for key, positions in group_by_parameters(inputs, self._neutral).items():
            group = [inputs[position] for position in positions]
            for position, output in zip(positions, self._run(group, dict(key)), strict=True):
                outputs[position] = output
        return outputs

    def _run(self, items: Sequence[object], shared: Mapping[str, object]) -> list[object]:
        """``items`` in one pipeline call, with ``shared`` (the parameters that change the
        forward pass, equal for all of them) and each item's own post-processing ones."""
        batch: list[object] = [input_of(item) for item in items]
        if self.takes_pairs:
            batch = [classifiable(item) for item in batch]
        pipeline = self._pipeline
        assert pipeline is not None  # predict checked it
        own = [self._postprocess_params(item) for item in items]
        kwargs = {**self._call_kwargs(), **shared}
        try:
            if any(own):
                with per_item_postprocess(pipeline, own):
                    outputs = pipeline(batch, batch_size=len(batch), **kwargs)
            else:
                outputs = pipeline(batch, batch_size=len(batch), **kwargs)
        except PipelineException as exc:
            if self.task == "fill-mask" and len(batch) == 1:
                # The request had its mask token (the data plane checks that before it is
                # queued), so truncation at the model's limit cut it off.
                raise UnprocessableInput(
                    f"the {self._mask()} token is beyond this model's {self.max_seq_length}-token "
                    "limit, so truncating the text removed it: put it earlier or send less text"
                ) from exc
            raise
        # Some pipelines (fill-mask, ...) unwrap a one-item list and return that item's output.
        if len(batch) == 1 and (self.task == "fill-mask" or not is_one_per_input(outputs, 1)):
            outputs = [outputs]
        if not is_one_per_input(outputs, len(batch)):
            raise RuntimeError(
                f"pipeline {self.task!r} returned {type(outputs).__name__} "
                f"for {len(batch)} inputs, not one output per input"
            )
        return [jsonable(output) for output in outputs]

    def _postprocess_params(self, item: object) -> dict[str, object]:
        """The post-processing arguments of ``item``'s batch-neutral parameters, as the
        pipeline itself makes them from ``pipeline(text, **parameters)``.

        :raises UnprocessableInput: a value the pipeline refuses (a ``targets`` word outside
            the vocabulary, an aggregation a slow tokenizer cannot do), naming it.
        """
        if not isinstance(item, TaskItem):
            return {}
        given = {key: pipeline_value(value) for key, value in item.parameters}
        neutral = {key: value for key, value in given.items() if key in self._neutral}
        if not neutral:
            return {}
        if self.task == "fill-mask" and self._tokenizer is not None:
            vocabulary = len(self._tokenizer)
            top_k = neutral.get("top_k", 0)
            if isinstance(top_k, int) and top_k > vocabulary:
                # The pipeline would fail the whole batch (torch's topk past the end).
                raise UnprocessableInput(
                    f"parameter 'top_k' must be at most {vocabulary}, this model's vocabulary"
                )
        try:
            assert self._pipeline is not None  # predict checked it
            _, _, postprocess = self._pipeline._sanitize_parameters(**neutral)
        except (ValueError, KeyError, PipelineException) as exc:
            keys = ", ".join(repr(key) for key in sorted(neutral))
            raise UnprocessableInput(f"parameters {keys}: {exc}") from None
        return dict(postprocess)

    def _embed(self, inputs: Sequence[object]) -> np.ndarray:
        texts = require_strings(inputs)
        assert self._plan is not None and self._tokenizer is not None  # loaded with the pipeline
        with torch.inference_mode():
            hidden, mask = encode_and_run(
                self._tokenizer, self._plan, texts, self.max_seq_length, self._device
            )
            pooled = mean_pool(hidden, mask)
        return to_numpy(pooled)

    def count_tokens(self, item: object) -> int:
        """Tokens a text input (or text pair) costs, capped at the max length; 1 for anything
        else."""
        text = self._text_of(item)
        if text is None:
            return 1
        return self._counter.counter().count(*text)

    def token_length(self, item: object, limit: int) -> int:
        """Tokens a text input (or text pair) has before truncation, counted no further than
        ``limit``; 1 for anything else."""
        text = self._text_of(item)
        if text is None:
            return 1
        return self._counter.counter().length(text[0], limit, text[1])

    def _text_of(self, item: object) -> tuple[str, str | None] | None:
        if not self.is_text:
            return None
        value = input_of(item)
        if isinstance(value, str):
            return value, None
        if self.takes_pairs and isinstance(value, dict):
            pair = pair_of(value)
            if pair is not None:
                return pair
        return None

    def warmup_inputs(self, max_batch_size: int) -> list[list[str]]:
        """A longest-length text at batch 1 and at the cap.

        :raises ValueError: for a task whose inputs this class cannot make: a task model
            proves it serves before it reports ready, so it never goes without a warm-up.
        """
        if not self.is_text:
            raise ValueError(f"{self.task}: this model cannot make a warm-up input of its kind")
        length = self.max_seq_length
        if self.task == "fill-mask":
            mask = self._mask_token()
            if mask is None:
                raise ValueError(f"{self.path}: the tokenizer has no mask token for fill-mask")
            # The mask goes first so truncation can never cut it off.
            return warmup_batches(f"{mask} " + warmup_text(length), max_batch_size)
        return warmup_batches(warmup_text(length), max_batch_size)

    def _mask_token(self) -> str | None:
        """The token a fill-mask text must hold: the one whose word the model predicts."""
        tokenizer = getattr(self._pipeline, "tokenizer", None)
        mask = getattr(tokenizer, "mask_token", None) or self._counter.counter().mask_token
        return str(mask) if mask else None

    def metadata(self) -> dict[str, object]:
        name = "text" if self.is_text else "input"
        inputs: list[dict[str, object]] = [{"name": name, "datatype": "BYTES", "shape": [-1]}]
        described: dict[str, object] = {}
        if self.task == "feature-extraction":
            width = self._config.get("hidden_size") or self._config.get("d_model") or -1
            # Mean-pooled hidden states, not unit vectors.
            outputs = [
                {"name": "embedding", "datatype": "FP32", "shape": [-1, width], "normalized": False}
            ]
        else:
            # Structured results (labels, candidates, ...) travel as JSON strings.
            outputs = [{"name": "output", "datatype": "BYTES", "shape": [-1]}]
        if self.task == "fill-mask":
            # Every text must hold it: the server refuses one without it (422) before it is
            # queued, instead of letting it fail the batch it joins.
            mask = self._mask_token()
            if mask is not None:
                described["mask_token"] = mask
        if self.takes_pairs:
            inputs.append(
                {"name": "text_pair", "datatype": "BYTES", "shape": [-1], "optional": True}
            )
            labels = labels_of(self._config)
            if labels:
                described["labels"] = labels
        if self.parameters:
            described[PARAMETERS_KEY] = {
                name: param.describe() for name, param in self.parameters.items()
            }
        if self._plan is not None:
            described["engine"] = self._plan.describe()
        return {"inputs": inputs, "outputs": outputs, "task": self.task, **described}
