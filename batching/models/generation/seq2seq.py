"""summarization, translation and text2text-generation: an encoder-decoder model (T5, BART,
Marian, ...) answering each text, token by token in its running batch
(:mod:`.seq2seq_batch`; transformers 5 removed these pipelines).

- The task's entry in the model's ``config.task_specific_params`` applies as the pipelines
  applied it: its ``prefix`` is put before each text (T5's ``"summarize: "``), its generation
  settings (``min_length``, ``no_repeat_ngram_size``, ...) become the model's defaults, and
  its ``max_length`` the default ``max_new_tokens``. Every row runs one beam.
- translation: the languages are the ones the model's ``translation_<src>_to_<tgt>`` entries
  name. ``--task translation_en_to_de`` picks the default pair; a request picks another with
  ``src_lang`` and ``tgt_lang`` (declared only when the model names several pairs). A model
  that names none (a single-pair model such as Marian's) translates as it was trained. A
  model whose tokenizer selects languages by language-code tokens (mBART, M2M100, NLLB) is
  refused at load.
- An input longer than the encoder's limit is cut at the end (the start is kept), or with
  ``truncate: false`` refused with a 413 naming the limit.
- Answers: ``{"summary_text"}``, ``{"translation_text"}``, ``{"generated_text"}``.
- Every door runs the model token by token (:meth:`Seq2SeqGenerator.decode_batch`), each
  item prepared as here (prefix, languages, truncation).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from transformers.models.auto.modeling_auto import AutoModelForSeq2SeqLM

from ..parameters import Param, TaskItem
from ..shared.text_models import DEFAULT_MAX_LENGTH, max_length_of, position_limit
from ..tasks.generation import SUMMARIZATION, TEXT2TEXT_GENERATION, TRANSLATION, pair_of
from .generator import GenerationModel, Prompt
from .pieces import Answer
from .seq2seq_batch import Seq2SeqDecodeBatch
from .settings import MAX_NEW_TOKENS_CAP, Settings

__all__ = ["Seq2SeqGenerator"]

#: The tasks served, what they declare, and the key of their answers.
_TASKS: dict[str, tuple[tuple[Param, ...], str]] = {
    "summarization": (SUMMARIZATION, "summary_text"),
    "translation": (TRANSLATION, "translation_text"),
    "text2text-generation": (TEXT2TEXT_GENERATION, "generated_text"),
}
#: GenerationConfig's own max_length: a model that leaves it there sets no length.
_LIBRARY_MAX_LENGTH = 20
# task_specific_params keys that are not generation settings.
_NOT_GENERATION = frozenset({"prefix", "max_length"})


class Seq2SeqGenerator(GenerationModel):
    """An encoder-decoder task from a local model folder."""

    auto_class: ClassVar[Any] = AutoModelForSeq2SeqLM

    def __init__(self, task: str, *args: Any, **kwargs: Any) -> None:
        pair = pair_of(task)
        super().__init__("translation" if pair else task, *args, **kwargs)
        if self.task not in _TASKS:
            raise ValueError(f"{task!r} is not an encoder-decoder task")
        self._declared, self.answer_key_of = _TASKS[self.task]
        params = getattr(self.config, "task_specific_params", None) or {}
        self._task_params: dict[str, Any] = params if isinstance(params, dict) else {}
        #: The translation pairs the model names, and their entries.
        self.pairs: dict[tuple[str, str], dict[str, Any]] = {}
        for key, value in self._task_params.items():
            found = pair_of(key)
            if found and isinstance(value, dict):
                self.pairs[found] = value
        self.pair: tuple[str, str] | None = None
        if self.task == "translation":
            if pair is not None:
                self.pair = pair
                if self.pairs and self.pair not in self.pairs:
                    raise ValueError(
                        f"{self.path}: the model translates {_pairs(self.pairs)}, not "
                        f"{self.pair[0]} to {self.pair[1]}"
                    )
            elif len(self.pairs) == 1:
                self.pair = next(iter(self.pairs))
            elif self.pairs:
                raise ValueError(
                    f"{self.path}: the model translates {_pairs(self.pairs)}; say which is the "
                    "default with --task translation_<src>_to_<tgt>"
                )

    def _entry(self) -> dict[str, Any]:
        """The task's own entry of ``task_specific_params``."""
        if self.task == "translation":
            return self.pairs.get(self.pair, {}) if self.pair else {}
        entry = self._task_params.get(self.task)
        return entry if isinstance(entry, dict) else {}

    def prepare_tokenizer(self, tokenizer: Any) -> None:
        if self.task == "translation" and getattr(tokenizer, "src_lang", None) is not None:
            raise ValueError(
                f"{self.path}: this tokenizer picks languages by language-code tokens (mBART, "
                "M2M100, NLLB), which the translation task does not serve; use a model "
                "trained for one pair or with task prefixes (Marian, T5)"
            )
        if tokenizer.pad_token is None:
            raise ValueError(f"{self.path}: the tokenizer has no pad token")
        tokenizer.padding_side = "right"
        tokenizer.truncation_side = "right"

    def configure(self, model: Any) -> None:
        entry = self._entry()
        settings = {
            key: value
            for key, value in entry.items()
            if key not in _NOT_GENERATION and hasattr(model.generation_config, key)
        }
        if settings:
            model.generation_config.update(**settings)
        # The task's max_length, else the model's own when it sets one (not the library's
        # old default of 20), is the default length; it counts the decoder's start token.
        length = entry.get("max_length")
        if not isinstance(length, int):
            length = model.generation_config.max_length
            if length == _LIBRARY_MAX_LENGTH:
                length = None
        if (
            isinstance(length, int)
            and length > 1
            and model.generation_config.max_new_tokens is None
        ):
            model.generation_config.max_new_tokens = length - 1

    def input_length(self) -> int:
        # The encoder's positions bound it even where the tokenizer allows more.
        return max_length_of(self._tokenizer, self.config)

    def max_new_tokens_limit(self) -> int:
        positions = position_limit(self.config)
        return (
            MAX_NEW_TOKENS_CAP
            if positions is None
            else max(1, min(MAX_NEW_TOKENS_CAP, positions - 1))
        )

    def input_limit(self, settings: Settings) -> int:
        return self.max_seq_length or DEFAULT_MAX_LENGTH

    def positions(self) -> int:
        """The most tokens a sequence may hold: its longest input and longest answer (the
        scheduler's default token budget is ``max_batch_size`` of these)."""
        return (self.max_seq_length or DEFAULT_MAX_LENGTH) + self.max_new_tokens_limit()

    def decode_batch(self) -> Seq2SeqDecodeBatch:
        """An empty running batch of this instance's model.

        :raises NotImplementedError: the model's decoder cannot run as a running batch.
        """
        return Seq2SeqDecodeBatch(self._model, self._tokenizer, self._prepare, self.answer)

    def declared(self) -> tuple[Param, ...]:
        return self._declared

    def model_params(self, params: dict[str, Param]) -> dict[str, Param]:
        if self.task != "translation":
            return params
        if not self.pairs or self.pair is None:
            # A model that names no pairs translates as it was trained: no languages to pick.
            return {k: v for k, v in params.items() if k not in ("src_lang", "tgt_lang")}
        sources = tuple(sorted({source for source, _ in self.pairs}))
        targets = tuple(sorted({target for _, target in self.pairs}))
        return {
            **params,
            "src_lang": replace(params["src_lang"], default=self.pair[0], choices=sources),
            "tgt_lang": replace(params["tgt_lang"], default=self.pair[1], choices=targets),
        }

    def source_text(self, text: str, parameters: dict[str, Any]) -> str:
        if self.task != "translation" or self.pair is None:
            prefix = self._entry().get("prefix")
            return f"{prefix}{text}" if isinstance(prefix, str) else text
        pair = (
            str(parameters.get("src_lang", self.pair[0])),
            str(parameters.get("tgt_lang", self.pair[1])),
        )
        entry = self.pairs.get(pair)
        if entry is None:
            raise ValueError(
                f"this model translates {_pairs(self.pairs)}, not {pair[0]} to {pair[1]}"
            )
        prefix = entry.get("prefix")
        return f"{prefix}{text}" if isinstance(prefix, str) else text

    def _text_of(self, item: Any) -> str | None:
        # What the model reads, as _prepare makes it: counted tokens include the task prefix.
        text = super()._text_of(item)
        if text is None:
            return None
        parameters = dict(item.parameters) if isinstance(item, TaskItem) else {}
        try:
            return self.source_text(text, parameters)
        except ValueError:
            return text  # a pair the model does not name: its join answers why

    def answer(self, prompt: Prompt, new_ids: list[int]) -> Answer:
        text = super().answer(prompt, new_ids)[self.answer_key]
        return {self.answer_key_of: text}


def _pairs(pairs: dict[tuple[str, str], Any]) -> str:
    return ", ".join(f"{source} to {target}" for source, target in sorted(pairs))
