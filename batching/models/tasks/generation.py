"""The request parameters of the generating tasks, served by
:mod:`batching.models.generation.causal` (text-generation) and
:mod:`batching.models.generation.seq2seq` (summarization, translation, text2text-generation),
and the ``translation_<src>_to_<tgt>`` spelling of translation.

What a task declares here is what the model repository's ``parameters`` defaults are checked
against at start-up. A loaded model declares the same keys in its metadata with its own
numbers: the most ``max_new_tokens`` its positions allow, and its generation config's
defaults (``do_sample``, ``temperature``, ...); translation's languages are the pairs the
model names. Only ``seed``, ``stop``, ``truncate``, ``return_full_text`` and the languages
are ``batch_neutral``: the others change the forward pass, so requests that set different
ones run as separate ``generate`` calls.
"""

from __future__ import annotations

import re

from batching.models.parameters import Param

__all__ = [
    "CHAT_TEMPLATE_KEY",
    "GENERATION",
    "SUMMARIZATION",
    "TEXT2TEXT_GENERATION",
    "TEXT_GENERATION",
    "TRANSLATION",
    "STREAMED_TASKS",
    "pair_of",
    "streams",
]

#: The most alternatives a request may ask for per token (OpenAI's own cap).
MAX_TOP_LOGPROBS = 20

#: The most stop strings a request may give, and the longest one (characters).
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256

#: What every generating task takes. A default of None is the model's own (its generation
#: config's, or for ``max_new_tokens`` 64, at most half its positions for a decoder).
GENERATION: tuple[Param, ...] = (
    Param("max_new_tokens", "integer", minimum=1, doc="the most tokens to generate"),
    Param("do_sample", "boolean", doc="sample the next token (false: the most likely one)"),
    Param(
        "temperature",
        "number",
        minimum=0.0,
        maximum=100.0,
        doc="divides the logits before sampling; 0 picks the most likely token",
    ),
    Param(
        "top_p",
        "number",
        minimum=0.0,
        maximum=1.0,
        doc="sample from the smallest set of tokens whose probability reaches top_p",
    ),
    Param("top_k", "integer", minimum=0, doc="sample from the top_k most likely tokens (0: all)"),
    Param(
        "repetition_penalty",
        "number",
        minimum=0.01,
        maximum=100.0,
        doc="divides the logits of tokens already in the text (1: none)",
    ),
    Param(
        "seed",
        "integer",
        minimum=0,
        maximum=2**63 - 1,
        batch_neutral=True,
        doc="makes sampling reproducible: the same text alone or in any batch",
    ),
    Param(
        "stop",
        "strings",
        batch_neutral=True,
        doc=f"up to {MAX_STOP_STRINGS} strings: the answer ends before the first one",
    ),
    Param(
        "truncate",
        "boolean",
        default=True,
        batch_neutral=True,
        doc="cut an input too long for the model (false: 413 naming the limit)",
    ),
    Param(
        "logprobs",
        "integer",
        minimum=0,
        maximum=MAX_TOP_LOGPROBS,
        batch_neutral=True,
        doc="each new token's log-probability and this many most likely alternatives",
    ),
    Param(
        "json_schema",
        "string",
        batch_neutral=True,
        doc="the answer is JSON valid under this JSON schema (a JSON text)",
    ),
    Param(
        "regex",
        "string",
        batch_neutral=True,
        doc="the answer matches this regular expression",
    ),
    Param(
        "grammar",
        "string",
        batch_neutral=True,
        doc="the answer follows this grammar (llguidance's Lark syntax)",
    ),
)

TEXT_GENERATION: tuple[Param, ...] = (
    *GENERATION,
    Param(
        "return_full_text",
        "boolean",
        default=True,
        batch_neutral=True,
        doc="the prompt followed by the completion (false: the completion alone)",
    ),
)

SUMMARIZATION = GENERATION
TEXT2TEXT_GENERATION = GENERATION

TRANSLATION: tuple[Param, ...] = (
    *GENERATION,
    Param("src_lang", "string", batch_neutral=True, doc="the language of the text"),
    Param("tgt_lang", "string", batch_neutral=True, doc="the language to translate to"),
)

_PAIR = re.compile(r"^translation_([A-Za-z-]+)_to_([A-Za-z-]+)$")


def pair_of(task: str) -> tuple[str, str] | None:
    """The languages ``translation_<src>_to_<tgt>`` names (None: not that spelling)."""
    found = _PAIR.match(task)
    return None if found is None else (found.group(1), found.group(2))


#: The tasks every door serves token by token (a running batch per thread instance): the
#: decoder-only one and the encoder-decoder ones.
STREAMED_TASKS = frozenset(
    {"text-generation", "summarization", "translation", "text2text-generation"}
)


#: The metadata key by which a generating model says whether its tokenizer has a chat
#: template (and so takes chats: ``/v1/chat/completions``).
CHAT_TEMPLATE_KEY = "chat_template"


def streams(task: str | None) -> bool:
    """Whether ``task`` (as ``--task`` or a model's metadata names it) is served token by
    token; ``translation_<src>_to_<tgt>`` is translation."""
    return task is not None and (task in STREAMED_TASKS or pair_of(task) is not None)
