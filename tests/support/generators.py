"""Tiny randomly initialised generating models written to a folder: a GPT-2 with GPT-2's own
tokenizer class (byte-level BPE, no pad token), and a T5 and a BART for the encoder-decoder
tasks. Built from a config, offline, in well under a second."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import transformers

from tests.support.tiny import WORDS

#: The GPT-2's positions: prompts and new tokens together.
GPT2_POSITIONS = 32
#: The encoder-decoders' input limit in tokens.
SEQ2SEQ_MAX_INPUT = 40

_CORPUS = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]


def _byte_level_files(folder: Path, specials: list[str]) -> tuple[str, str]:
    """vocab.json and merges.txt of a small byte-level BPE trained on the test words."""
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(_CORPUS, vocab_size=320, min_frequency=1, special_tokens=specials)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = trainer.save_model(str(folder))
    return vocab, merges


def gpt2_folder(
    root: Path,
    name: str = "gpt2",
    *,
    model_max_length: int | None = GPT2_POSITIONS,
    positions: int = GPT2_POSITIONS,
) -> Path:
    """A GPT-2 whose tokenizer has no pad token, as GPT-2's own has none; its tokenizer's
    ``model_max_length`` (None: it names no limit) and its ``positions``."""
    folder = root / name
    vocab, merges = _byte_level_files(folder, ["<|endoftext|>"])
    tokenizer = transformers.GPT2Tokenizer(vocab=vocab, merges=merges)
    assert tokenizer.pad_token is None
    if model_max_length is not None:
        tokenizer.model_max_length = model_max_length
    tokenizer.save_pretrained(folder)
    eos = tokenizer.eos_token_id
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=positions,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
        initializer_range=0.5,
    )
    torch.manual_seed(3)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def t5_folder(root: Path, name: str = "t5") -> Path:
    """A T5 naming a summarization prefix and two translation pairs in its
    ``task_specific_params``, as t5-small does, with a byte-level tokenizer."""
    folder = root / name
    specials = ["<pad>", "</s>", "<unk>"]
    vocab, merges = _byte_level_files(folder, specials)
    backend = transformers.PreTrainedTokenizerFast(
        tokenizer_file=None,
        tokenizer_object=_bpe(vocab, merges, "</s>"),
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=SEQ2SEQ_MAX_INPUT,
    )
    backend.save_pretrained(folder)
    config = transformers.T5Config(
        vocab_size=len(backend),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=2,
        pad_token_id=backend.pad_token_id,
        eos_token_id=backend.eos_token_id,
        decoder_start_token_id=backend.pad_token_id,
        initializer_factor=4.0,
        task_specific_params={
            "summarization": {"prefix": "summarize: ", "max_length": 9},
            "translation_en_to_de": {"prefix": "translate English to German: "},
            "translation_en_to_fr": {"prefix": "translate English to French: "},
        },
    )
    torch.manual_seed(4)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    return folder


def bart_folder(
    root: Path,
    name: str = "bart",
    *,
    model_max_length: int | None = SEQ2SEQ_MAX_INPUT,
    positions: int = 64,
) -> Path:
    """A BART with BART's own tokenizer class: its tokenizer's ``model_max_length`` (None: it
    names no limit) and ``positions`` (``max_position_embeddings``)."""
    folder = root / name
    vocab, merges = _byte_level_files(folder, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer = transformers.BartTokenizer(vocab=vocab, merges=merges)
    if model_max_length is not None:
        tokenizer.model_max_length = model_max_length
    tokenizer.save_pretrained(folder)
    config = transformers.BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        init_std=0.5,
    )
    torch.manual_seed(5)
    transformers.BartForConditionalGeneration(config).save_pretrained(folder)
    return folder


def _bpe(vocab: str, merges: str, eos: str) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.BPE.from_file(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    eos_id = json.loads(Path(vocab).read_text())[eos]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", special_tokens=[(eos, eos_id)]
    )
    return tokenizer


def direct(reference: tuple[Any, Any], ids: list[int], **kwargs: Any) -> list[int]:
    """The new tokens of one unpadded ``generate`` call on a causal ``(tokenizer, model)``,
    greedy."""
    tokenizer, model = reference
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
            **kwargs,
        )
    return list(out[0, len(ids) :].tolist())


def completion_of(reference: tuple[Any, Any], ids: list[int], new: list[int]) -> str:
    """The text ``new`` adds to ``ids``, decoded as the pipeline does."""
    tokenizer = reference[0]
    before = tokenizer.decode(ids, skip_special_tokens=True)
    return str(tokenizer.decode(ids + new, skip_special_tokens=True))[len(before) :]


def causal_reference(folder: Path) -> tuple[Any, Any]:
    """A causal model folder as transformers loads it, for direct ``generate`` calls."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return tokenizer, transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()


@functools.cache
def seq2seq_reference(folder: Path) -> tuple[Any, Any]:
    """An encoder-decoder folder as transformers loads it, for direct ``generate`` calls."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return tokenizer, transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()


def direct_seq2seq(folder: Path, text: str, **kwargs: Any) -> str:
    """One input through an encoder-decoder's ``generate``, greedy, decoded."""
    tokenizer, model = seq2seq_reference(folder)
    encoded = tokenizer([text], return_tensors="pt", truncation=True)
    with torch.inference_mode():
        out = model.generate(**encoded, do_sample=False, **kwargs)
    return str(tokenizer.decode(out[0], skip_special_tokens=True))


def greedy_text(folder: Path, prompt: str, tokens: int) -> str:
    """The greedy continuation of ``prompt`` by the causal LM in ``folder``, ``tokens`` new
    tokens, decoded as a completion (transformers' ``generate``, alone)."""
    reference = causal_reference(folder)
    ids = reference[0](prompt)["input_ids"]
    return completion_of(reference, ids, direct(reference, ids, max_new_tokens=tokens))
