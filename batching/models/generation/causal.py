"""text-generation: a decoder-only model (GPT-2, Llama, Qwen, ...) continuing each prompt,
token by token in its running batch (:mod:`.causal_batch`; not the pipeline).

- A tokenizer without a pad token (GPT-2's own) pads with its end-of-text token (one log
  line at load); prompts are padded on the left when they are prefilled together.
- A prompt longer than the model's positions allow, less the ``max_new_tokens`` it asks for,
  is cut from the left (its end is kept: that is what the model continues), or with
  ``truncate: false`` refused with a 413 naming the limit.
- The answer is ``{"generated_text": prompt + completion}``, as the pipeline's; with
  ``return_full_text: false`` the completion alone.
"""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar

from transformers.models.auto.modeling_auto import AutoModelForCausalLM

from ..engines.engine_options import EngineOptions
from ..parameters import Param
from ..shared.text_models import max_length_of
from ..tasks.generation import TEXT_GENERATION
from .causal_batch import DecodeBatch, check_cache
from .fused_step import FusedStep, fused_step_of
from .generator import GenerationModel, Prompt
from .pieces import Answer
from .prefix_cache import DEFAULT_PREFIX_CACHE_MB
from .prefix_prefill import prefix_cache
from .settings import MAX_NEW_TOKENS_CAP, Settings, cut_at_stop

__all__ = ["TextGenerator"]

logger = logging.getLogger("batching")


class TextGenerator(GenerationModel):
    """text-generation from a local decoder-only model folder.

    :param prefix_cache_mb: the most memory the instance's prompt prefixes may hold
        (:mod:`.prefix_cache`; 0: none kept).
    """

    auto_class: ClassVar[Any] = AutoModelForCausalLM
    answer_key: ClassVar[str] = "generated_text"
    completion_in_context: ClassVar[bool] = True
    #: :meth:`positions` and the tokenizer it was read with.
    _positions: tuple[Any, int] | None = None
    #: The loaded model's fused step (:mod:`.fused_step`), one for all its running batches.
    _fused: FusedStep | None = None

    def __init__(
        self,
        task: str,
        path: str | os.PathLike[str],
        engine: EngineOptions | None = None,
        *,
        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
    ) -> None:
        super().__init__(task, path, engine)
        #: The prompt prefixes the doors' requests leave (the scheduler's running batch).
        self.prefixes = prefix_cache(prefix_cache_mb)

    def positions(self) -> int:
        """The longest sequence (prompt and new tokens) the model takes: the smaller of its
        positions and its tokenizer's limit."""
        known = self._positions
        if known is not None and known[0] is self._tokenizer:
            return known[1]
        # Read once per tokenizer: each request's limits ask for it, and reading it walks
        # the whole config (its to_dict).
        value = max_length_of(self._tokenizer, self.config, default=MAX_NEW_TOKENS_CAP + 1)
        self._positions = (self._tokenizer, value)
        return value

    def input_length(self) -> int:
        return self.positions()

    def max_new_tokens_limit(self) -> int:
        # At least one prompt token must fit.
        return max(1, min(MAX_NEW_TOKENS_CAP, self.positions() - 1))

    def default_length_bound(self) -> int:
        # By default, half the positions stay for the prompt.
        return max(1, self.positions() // 2)

    def input_limit(self, settings: Settings) -> int:
        return max(1, self.positions() - settings.max_new_tokens)

    def limit_reason(self, settings: Settings) -> str:
        return f": its {self.positions()} positions less max_new_tokens {settings.max_new_tokens}"

    def declared(self) -> tuple[Param, ...]:
        return TEXT_GENERATION

    def prepare_tokenizer(self, tokenizer: Any) -> None:
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ValueError(
                    f"{self.path}: the tokenizer has neither a pad token nor an end-of-text "
                    "token to pad with; set pad_token in its tokenizer_config.json"
                )
            tokenizer.pad_token = tokenizer.eos_token
            logger.info(
                "model %s: the tokenizer has no pad token; padding with its end-of-text token %r",
                self.name,
                tokenizer.eos_token,
            )
        tokenizer.padding_side = "left"
        tokenizer.truncation_side = "left"

    def load(self, device: str) -> None:
        super().load(device)
        self._fused = fused_step_of(self._model)
        if self._fused is not None:
            decided = self._fused.pack()
            if decided is not None:
                logger.info("%s: %s", self.path.name, decided)

    def decode_batch(self) -> DecodeBatch:
        """An empty running batch of this instance's model.

        :raises NotImplementedError: the model's cache cannot join a running batch.
        """
        check_cache(self._model.config)
        eos = self._model.generation_config.eos_token_id
        if eos is None:
            eos = self._tokenizer.eos_token_id
        ends = [eos] if isinstance(eos, int) else list(eos or [])
        batch = DecodeBatch(self._model, self._tokenizer, ends, self._prepare, self.answer)
        batch.prefixes = self.prefixes
        batch.fused = self._fused
        return batch

    def direct_batch(self) -> DecodeBatch:
        # The warm-up's texts are not worth keeping: its batch keeps no prefixes.
        batch = self.decode_batch()
        batch.prefixes = None
        return batch

    def empty_input(self) -> list[int]:
        # An empty prompt starts from the beginning-of-text token, as GPT-2 was trained to.
        bos = self._tokenizer.bos_token_id
        return [bos] if bos is not None else []

    def answer(self, prompt: Prompt, new_ids: list[int]) -> Answer:
        tokenizer = self._tokenizer
        # As the pipeline does: decode prompt and completion together and drop the prompt's
        # decoded length, so a tokenizer that joins words across them decodes them right.
        before = tokenizer.decode(prompt.ids, skip_special_tokens=True)
        whole = tokenizer.decode(prompt.ids + new_ids, skip_special_tokens=True)
        completion = cut_at_stop(whole[len(before) :], prompt.stop)
        if prompt.parameters.get("return_full_text", True):
            return {"generated_text": prompt.text + completion}
        return {"generated_text": completion}
