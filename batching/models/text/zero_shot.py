"""zero-shot-classification: an NLI model scoring a text against labels chosen per request.

Each (text, label) pair is one unit of batching: :meth:`ZeroShotModel.expand` makes a
request item (a :class:`~batching.models.parameters.TaskItem` with ``candidate_labels``) into
one ``{"text": text, "text_pair": hypothesis}`` unit per label, the data plane queues and packs
those like any items (token-aware batching counts each pair), :meth:`predict` runs the pairs
through the engine chosen at start-up (as text-classification does: an exported
sequence-classification head, checked against torch fp32) and returns each pair's
(contradiction, entailment) logits, and :meth:`join` assembles the pipeline's answer
(:func:`~batching.models.text.nli.zero_shot_answer`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
import transformers
from numpy.typing import ArrayLike
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from ..engines.engine_options import EngineOptions
from ..engines.job import EngineJob
from ..engines.logits import scores
from ..engines.plan import EnginePlan
from ..engines.selection import select_engine
from ..parameters import PARAMETERS_KEY, InvalidParameter, TaskItem
from ..protocol import EXPANDS_KEY, warmup_batches
from ..shared.text_models import LazyCounter
from ..shared.torch_models import (
    TokenCounter,
    calibration_texts,
    load_eval,
    read_config,
    resolve_device,
    to_numpy,
    warmup_text,
)
from .nli import (
    DEFAULT_TEMPLATE,
    ZERO_SHOT_PARAMETERS,
    ZERO_SHOT_TASK,
    ZeroShotAnswer,
    nli_logit_ids,
    zero_shot_answer,
    zero_shot_request,
)

__all__ = ["ZeroShotModel"]

#: At most this many special tokens are added to a hypothesis ([CLS], [SEP], <s>, </s>, ...).
_SPECIAL_TOKENS = 8

#: The labels the warm-up scores its text against.
_WARMUP_LABELS = ("positive", "negative")


class Pair(TypedDict):
    """One unit of batching: the text, and the hypothesis one label makes of it."""

    text: str
    text_pair: str


class ZeroShotModel:
    """``pipeline("zero-shot-classification")``'s answers, one (text, label) pair per unit of
    batching.

    :param task: ``zero-shot-classification`` (every task's class is built alike).
    :param path: a local NLI model folder (a sequence classifier whose config's ``label2id``
        names an entailment label; checked now, so a wrong model fails at start-up).
    :param engine: what computes the logits (:mod:`batching.models.engines`); None: torch fp32.
    """

    def __init__(
        self, task: str, path: str | os.PathLike[str], engine: EngineOptions | None = None
    ) -> None:
        if task != ZERO_SHOT_TASK:
            raise ValueError(f"ZeroShotModel serves {ZERO_SHOT_TASK}, not {task!r}")
        self.task = task
        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise ValueError(f"model folder {str(self.path)!r} has no config.json")
        self.name = self.path.resolve().name
        self._config = read_config(self.path / "config.json")
        self._contradiction, self._entailment = nli_logit_ids(self._config)
        problem = self._config.get("problem_type")
        self._problem_type = problem if isinstance(problem, str) else None
        self.engine = engine or EngineOptions(engine="torch", precision="fp32")
        self._device = torch.device("cpu")
        self._plan: EnginePlan | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._counting = LazyCounter(self.path)

    @property
    def max_seq_length(self) -> int:
        return self._counting.resolved_max_length()

    def _token_counter(self) -> TokenCounter:
        return self._counting.counter()

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        tokenizer = self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path))
        if tokenizer.pad_token is None:
            # As the pipeline does: pairs of a batch are padded to the longest.
            tokenizer.pad_token = tokenizer.eos_token
        self._counting.resolve(tokenizer, self._config)
        self._plan = select_engine(
            EngineJob(
                options=self.engine,
                folder=self.path,
                head="sequence-classification",
                measure="classification",
                device=str(self._device),
                input_names=tuple(tokenizer(["a"], return_tensors="pt").keys()),
                load_reference=self._load_reference,
                view=self._view,
                calibration=self._calibration,
                sample=self._sample,
            )
        )

    def _load_reference(self) -> PreTrainedModel:
        return load_eval(transformers.AutoModelForSequenceClassification, self.path, self._device)

    def _encode(self, texts: list[str], hypotheses: list[str]) -> BatchEncoding:
        """Pairs as the pipeline tokenises them: only the text is cut to fit, never the
        hypothesis (:meth:`expand` refuses one that takes over half the model's tokens)."""
        if self._tokenizer is None:
            raise RuntimeError("ZeroShotModel used before load()")
        encoded: BatchEncoding = self._tokenizer(
            texts,
            hypotheses,
            padding=True,
            truncation="only_first",
            max_length=self.max_seq_length,
            return_tensors="pt",
        )
        return encoded.to(self._device) if self._device.type != "cpu" else encoded

    def _calibration(self) -> list[BatchEncoding]:
        texts = calibration_texts(self.max_seq_length // 2)
        hypotheses = [DEFAULT_TEMPLATE.format(label) for label in ("sports", "a red house")]
        pairs = [hypotheses[i % 2] for i in range(len(texts))]
        return [self._encode(texts, pairs), self._encode(texts[-1:], pairs[-1:])]

    def _sample(self, size: int) -> BatchEncoding:
        text = warmup_text(self.max_seq_length)
        return self._encode([text] * size, [DEFAULT_TEMPLATE.format(_WARMUP_LABELS[0])] * size)

    def _view(self, output: torch.Tensor, encoded: BatchEncoding) -> np.ndarray:
        # ONNX Runtime and OpenVINO answer in numpy; torch in tensors.
        return scores(self._problem_type, torch.as_tensor(output))

    # -- the units of batching -------------------------------------------------------------

    def expand(self, item: object) -> list[Any]:
        """One ``{"text", "text_pair"}`` unit per candidate label, in the labels' order.

        :raises InvalidParameter: no labels, a bad template, or a hypothesis so long that the
            text would have no room (over half the model's tokens).
        """
        request = zero_shot_request(item)
        units: list[Pair] = []
        half = self.max_seq_length // 2
        counter = self._token_counter()
        for label, hypothesis in zip(request.labels, request.hypotheses(), strict=True):
            # A token covers at least one byte of text: a short hypothesis needs no count.
            if (
                len(hypothesis.encode()) + _SPECIAL_TOKENS > half
                and counter.count(hypothesis) > half
            ):
                raise InvalidParameter(
                    f"candidate label {label[:40]!r} makes a hypothesis of over {half} tokens, "
                    f"half of this model's {self.max_seq_length}: shorten the label or the "
                    "hypothesis_template"
                )
            units.append({"text": request.text, "text_pair": hypothesis})
        return units

    def join(self, item: object, outputs: Sequence[ArrayLike]) -> ZeroShotAnswer:
        """The pipeline's ``{"sequence", "labels", "scores"}`` from the units' logits."""
        return zero_shot_answer(zero_shot_request(item), outputs)

    def unload(self) -> None:
        """Stop the engine plan's background threads (idle release, retake)."""
        if self._plan is not None:
            self._plan.close()

    def predict(self, inputs: Sequence[object]) -> np.ndarray:
        """Each pair's (contradiction, entailment) logits, one row per pair."""
        if self._plan is None:
            raise RuntimeError("ZeroShotModel.predict called before load()")
        if not inputs:
            return np.zeros((0, 2), dtype=np.float32)
        texts, hypotheses = [], []
        for item in inputs:
            pair = _pair(item)
            texts.append(pair[0])
            hypotheses.append(pair[1])
        with torch.inference_mode():
            logits = torch.as_tensor(self._plan(self._encode(texts, hypotheses)))
            picked = logits[:, [self._contradiction, self._entailment]]
            return to_numpy(picked).copy()

    # -- the optional hooks ----------------------------------------------------------------

    def count_tokens(self, item: object) -> int:
        """Tokens a pair costs (its text truncated to fit), or a request item's text."""
        text, pair = _text_of(item)
        return self._token_counter().count(text, pair)

    def token_length(self, item: object, limit: int) -> int:
        text, pair = _text_of(item)
        return self._token_counter().length(text, limit, pair)

    def warmup_inputs(self, max_batch_size: int) -> list[list[TaskItem]]:
        """Request items, which the warm-up expands and joins as a request's are: a longest
        text with two labels, then one label at batch 1 and at the cap (one pair each)."""
        text = warmup_text(self.max_seq_length)
        one = TaskItem(text, (("candidate_labels", _WARMUP_LABELS[:1]),))
        return [
            [TaskItem(text, (("candidate_labels", _WARMUP_LABELS),))],
            *warmup_batches(one, max_batch_size),
        ]

    def metadata(self) -> dict[str, object]:
        described: dict[str, object] = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            # {"sequence", "labels", "scores"} per text, as a JSON string.
            "outputs": [{"name": "output", "datatype": "BYTES", "shape": [-1]}],
            "task": ZERO_SHOT_TASK,
            PARAMETERS_KEY: {name: p.describe() for name, p in ZERO_SHOT_PARAMETERS.items()},
            EXPANDS_KEY: True,
        }
        if self._plan is not None:
            described["engine"] = self._plan.describe()
        return described


def _pair(item: object) -> tuple[str, str]:
    if isinstance(item, dict):
        text, hypothesis = item.get("text"), item.get("text_pair")
        if isinstance(text, str) and isinstance(hypothesis, str) and len(item) == 2:
            return text, hypothesis
    raise TypeError(
        "zero-shot-classification runs {'text': ..., 'text_pair': hypothesis} pairs, not "
        f"{type(item).__name__}"
    )


def _text_of(item: object) -> tuple[str, str | None]:
    """What an item tokenises: a pair unit, or a request item's (or plain) text."""
    if isinstance(item, dict):
        return _pair(item)
    text = item.input if isinstance(item, TaskItem) else item
    if not isinstance(text, str):
        raise TypeError(f"expected a text, got {type(text).__name__}")
    return text, None
