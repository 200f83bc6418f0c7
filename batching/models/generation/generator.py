"""A model that answers each text with generated text: what the decoder-only
(:mod:`.causal`) and the encoder-decoder (:mod:`.seq2seq`) generators share.

Every item runs through the model's running batch (:meth:`GenerationModel.decode_batch`,
:mod:`.running`), token by token: the doors' items through the scheduler
(:mod:`batching.runtime.scheduler`), which joins them as they come; a direct ``predict`` (the
warm-up's) with every item joining at once. Each item is prepared first (tokenised, its
``truncate`` rule applied: an input the model cannot take fails before any token is
generated), and answered from its new tokens (:meth:`GenerationModel.answer`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import torch

# The auto classes from their own modules, not through transformers' lazy top-level module:
# instances load on threads of their own, and two threads asking the lazy module for a name at
# once can see it missing.
from transformers.models.auto.configuration_auto import AutoConfig
from transformers.models.auto.modeling_auto import AutoModelForCausalLM
from transformers.models.auto.tokenization_auto import AutoTokenizer

from batching.errors import PayloadTooLarge, UnprocessableInput

from ..chat import Chat
from ..engines.engine_options import EngineOptions
from ..parameters import PARAMETERS_KEY, Param, Parameters, TaskItem
from ..shared.text_models import DEFAULT_MAX_LENGTH, LazyCounter
from ..shared.torch_models import WEIGHTS_LOADING, TokenCounter, resolve_device, warmup_text
from ..tasks.generation import CHAT_TEMPLATE_KEY
from .completion_rule import fit, rule_of
from .packed_products import pack_output_layer
from .pieces import Answer
from .row_options import extras_of
from .running import Prompt, RunningBatchBase
from .settings import (
    MAX_NEW_TOKENS_CAP,
    Defaults,
    Settings,
    check_stop,
    cut_at_stop,
    generation_params,
    input_text,
)

__all__ = ["GenerationModel", "Prompt"]

logger = logging.getLogger("batching")


class GenerationModel:
    """The shared part of a generating task's model; subclasses say how a text becomes token
    ids, how a group is batched, and what the answer says.

    :param task: the task served.
    :param path: the local model folder.
    :param engine: accepted for the common signature; generation always runs on torch fp32
        (the start-up check refuses anything else).
    """

    #: The transformers class that loads the folder.
    auto_class: ClassVar[Any] = AutoModelForCausalLM
    #: The answer's key (``{"generated_text": ...}``).
    answer_key: ClassVar[str] = "generated_text"
    #: Whether the completion shares the input's context (a decoder's positions).
    completion_in_context: ClassVar[bool] = False

    def __init__(
        self, task: str, path: str | os.PathLike[str], engine: EngineOptions | None = None
    ) -> None:
        self.task = task
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"model folder {str(self.path)!r} does not exist")
        self.name = self.path.resolve().name
        self.engine = engine
        self.config: Any = AutoConfig.from_pretrained(str(self.path))
        self._model: Any = None
        self._tokenizer: Any = None
        self._device = torch.device("cpu")
        self._counting = LazyCounter(self.path)
        self.defaults = Defaults()
        self.params: dict[str, Param] = {}
        #: The longest input in tokens (before the room generation needs, for decoders).
        self.max_seq_length: int | None = None

    # -- what subclasses say ---------------------------------------------------------------

    def max_new_tokens_limit(self) -> int:
        """The most new tokens a request may ask for."""
        return MAX_NEW_TOKENS_CAP

    def default_length_bound(self) -> int:
        """The most new tokens a request gets when it does not say."""
        return self.max_new_tokens_limit()

    def input_limit(self, settings: Settings) -> int:
        """The most tokens an input may have with ``settings``."""
        raise NotImplementedError

    def input_length(self) -> int:
        """The longest input in tokens, once loaded
        (:func:`~..shared.text_models.max_length_of`; for a decoder, its positions: the input and
        the new tokens together)."""
        raise NotImplementedError

    def declared(self) -> tuple[Param, ...]:
        """The parameters the task declares (:mod:`batching.models.tasks.generation`)."""
        raise NotImplementedError

    def model_params(self, params: dict[str, Param]) -> dict[str, Param]:
        """``params`` as this model takes them (languages it names, ...)."""
        return params

    def source_text(self, text: str, parameters: dict[str, Any]) -> str:
        """The text the model reads for ``text`` (a task prefix added, ...)."""
        return text

    def positions(self) -> int:
        """The most tokens a sequence may hold (the scheduler's default token budget is
        ``max_batch_size`` of these)."""
        raise NotImplementedError

    def decode_batch(self) -> RunningBatchBase[Any]:
        """An empty running batch of this instance's model.

        :raises NotImplementedError: the model's cache or decoder cannot run as a running
            batch (it is then refused at load: its warm-up runs one).
        """
        raise NotImplementedError

    def direct_batch(self) -> RunningBatchBase[Any]:
        """The running batch of a direct ``predict`` (the warm-up's): as the doors' by
        default."""
        return self.decode_batch()

    def answer(self, prompt: Prompt, new_ids: list[int]) -> Answer:
        """The answer to ``prompt`` from its row's new token ids."""
        completion = cut_at_stop(
            self._tokenizer.decode(new_ids, skip_special_tokens=True), prompt.stop
        )
        return {self.answer_key: completion}

    def prepare_tokenizer(self, tokenizer: Any) -> None:
        """Set the tokenizer up for this model kind (padding, truncation side)."""

    # -- loading ----------------------------------------------------------------------------

    def load(self, device: str) -> None:
        self._device = resolve_device(device)
        tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        self.prepare_tokenizer(tokenizer)
        with WEIGHTS_LOADING:
            model = self.auto_class.from_pretrained(str(self.path), dtype=torch.float32)
        model.to(self._device)
        model.eval()
        self._model, self._tokenizer = model, tokenizer
        self.configure(model)
        packing = pack_output_layer(model)
        if packing is not None:
            logger.info("%s: %s", self.path.name, packing)
        beams = getattr(model.generation_config, "num_beams", 1) or 1
        if beams > 1:
            # Sequences join and leave a running batch step by step: one beam each.
            logger.warning(
                "%s: its generation config asks for num_beams=%d; this server decodes one beam "
                "per sequence (greedy, or sampled when asked), so answers may differ from "
                "transformers' beam search",
                self.path.name,
                beams,
            )
        self.max_seq_length = self._counting.max_length = self.input_length()
        self.defaults = Defaults.of(model.generation_config, self.default_length_bound())
        self.params = self.model_params(
            generation_params(self.declared(), self.defaults, self.max_new_tokens_limit())
        )

    def configure(self, model: Any) -> None:
        """Adjust the loaded model's generation config for this task (task settings)."""

    # -- serving ----------------------------------------------------------------------------

    def predict(self, inputs: list[Any]) -> list[Any]:
        """Every item through a running batch of its own, all joining at once (the doors'
        items go through the scheduler instead: :mod:`batching.runtime.scheduler`)."""
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__}.predict called before load()")
        prompts = [self._prepare(index, item) for index, item in enumerate(inputs)]
        return list(self.direct_batch().complete(prompts))

    def _prepare(self, index: int, item: Any) -> Prompt:
        """``item`` tokenised and truncated by its rule.

        :raises PayloadTooLarge: too long for the model with ``truncate: false``.
        :raises UnprocessableInput: not a text, or nothing the model can start from.
        """
        try:
            item = self._render(item, self._tokenizer)
            text, parameters = input_text(item)
            stop = check_stop(parameters.get("stop", ()))
            source = self.source_text(text, parameters)
        except (TypeError, ValueError) as exc:
            raise UnprocessableInput(f"inputs[{index}]: {exc}") from None
        settings = Settings.of(parameters, self.defaults)
        limit = self.input_limit(settings)
        ids: list[int] = self._tokenizer(source, verbose=False)["input_ids"]
        rule = rule_of(parameters)
        if rule is not None:
            # The OpenAI doors' rule: their context-length check instead of a cut.
            ids, length = fit(
                rule,
                ids,
                self.input_length(),
                rule.max_tokens or parameters.get("max_new_tokens"),
                self.completion_in_context,
            )
            if length is not None:
                settings = replace(settings, max_new_tokens=length)
        elif len(ids) > limit:
            if not parameters.get("truncate", True):
                raise PayloadTooLarge(
                    f"inputs[{index}] has {len(ids)} tokens; this model takes at most {limit}"
                    + self.limit_reason(settings)
                    + "; send less text, or truncate: true"
                )
            ids = self._tokenizer(source, truncation=True, max_length=limit)["input_ids"]
        if not ids:
            ids = self.empty_input()
            if not ids:
                raise UnprocessableInput(f"inputs[{index}] is empty: give a text to start from")
        return Prompt(
            text,
            ids,
            parameters,
            settings,
            parameters.get("seed"),
            stop,
            **extras_of(parameters, rule, f"inputs[{index}]"),
        )

    def limit_reason(self, settings: Settings) -> str:
        return ""

    def empty_input(self) -> list[int]:
        """The ids an empty input starts from (none: an empty input is refused)."""
        return []

    # -- hooks ------------------------------------------------------------------------------

    def _render(self, item: Any, tokenizer: Any) -> Any:
        """``item`` with a :class:`~.chat.Chat` turned into its prompt by the tokenizer's
        chat template (what the model is asked to continue).

        :raises ValueError: the tokenizer has no chat template.
        """
        chat = item.input if isinstance(item, TaskItem) else item
        if not isinstance(chat, Chat):
            return item
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "this model's tokenizer has no chat template: send a prompt to /v1/completions"
            )
        text = tokenizer.apply_chat_template(
            chat.as_messages(), tokenize=False, add_generation_prompt=True, **dict(chat.kwargs)
        )
        return TaskItem(text, item.parameters) if isinstance(item, TaskItem) else text

    def _text_of(self, item: Any) -> str | None:
        if isinstance(item, TaskItem):
            item = item.input
        if isinstance(item, Chat):
            try:
                item = self._render(item, self._token_counter().tokenizer)
            except ValueError:
                return None
        return item if isinstance(item, str) else None

    def _token_counter(self) -> TokenCounter:
        return self._counting.counter()

    def count_tokens(self, item: Any) -> int:
        """The tokens an item costs in a batch: its input (at most the model's length) and
        the new tokens it may generate."""
        text = self._text_of(item)
        if text is None:
            return 1
        parameters = dict(item.parameters) if isinstance(item, TaskItem) else {}
        settings = Settings.of(parameters, self.defaults)
        prompt = self._token_counter().count(text)
        rule = rule_of(parameters)
        if rule is None:
            return prompt + settings.max_new_tokens
        if rule.truncate_prompt_tokens is not None:
            prompt = min(prompt, rule.truncate_prompt_tokens)
        if rule.max_tokens is not None:
            return prompt + rule.max_tokens
        if self.completion_in_context and parameters.get("max_new_tokens") is None:
            # What is left of the context (a longer prompt is refused when prepared).
            return max(prompt + 1, self.input_length())
        return prompt + settings.max_new_tokens

    def token_length(self, item: Any, limit: int) -> int:
        """Tokens of an item's input before truncation, counted no further than ``limit``."""
        text = self._text_of(item)
        if text is None:
            return 1
        return self._token_counter().length(text, limit)

    def warmup_inputs(self, max_batch_size: int) -> list[list[Any]]:
        """A short generation at batch 1 from an input too long for the model (truncated),
        and at the batch cap from a short one: a model that cannot generate never reports
        ready."""
        short: Parameters = (("max_new_tokens", 2),)
        long_text = warmup_text(max(16, (self.max_seq_length or DEFAULT_MAX_LENGTH) + 8))
        batches = [[TaskItem(long_text, short)]]
        if max_batch_size > 1:
            batches.append([TaskItem(warmup_text(16), short)] * max_batch_size)
        return batches

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            # The answers ({"generated_text": ...}) travel as JSON strings.
            "outputs": [{"name": "output", "datatype": "BYTES", "shape": [-1]}],
            "task": self.task,
            CHAT_TEMPLATE_KEY: bool(getattr(self._tokenizer, "chat_template", None)),
            PARAMETERS_KEY: {name: param.describe() for name, param in self.params.items()},
        }
