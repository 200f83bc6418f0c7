"""Tiny randomly initialised BERTs written to a folder, for tests that serve real transformers
models offline and in milliseconds (the same recipe as ``tests/models/embedding/test_hf.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Before transformers is imported: nothing here may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

WORDS = [
    *("the", "a", "cat", "dog", "sat", "on", "mat", "is", "good", "bad", "movie", "very"),
    *("not", "i", "like", "it", "was", "and", "with", "red", "blue", "green", "house"),
    *("tree", "runs", "fast", "slow", "what", "where", "who", "eats", "fish", "sleeps"),
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: The position table: the models' max length in tokens.
POSITIONS = 64
HIDDEN = 32
#: The sentence-transformers folders' max_seq_length.
ST_MAX_SEQ = 16


def bert_config(**extra: Any) -> transformers.BertConfig:
    # A wide initializer spreads the random outputs apart, so a swapped order is visible.
    return transformers.BertConfig(
        vocab_size=len(SPECIALS) + len(WORDS),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=POSITIONS,
        initializer_range=0.5,
        **extra,
    )


def _tokenizer(folder: Path, root: Path, model_max_length: int | None = None) -> None:
    """A word-piece tokenizer over the test words; ``model_max_length`` None: it names no
    limit (transformers saves its sentinel)."""
    vocab = root / "vocab.txt"
    if not vocab.is_file():
        vocab.write_text("\n".join(SPECIALS + WORDS) + "\n")
    limit = {} if model_max_length is None else {"model_max_length": model_max_length}
    transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=True, **limit).save_pretrained(
        folder
    )


def sentence_folder(
    root: Path,
    name: str = "st",
    normalize: bool = True,
    *,
    pooling: str | list[str] | None = None,
    include_prompt: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    max_seq_length: int = ST_MAX_SEQ,
    model_max_length: int | None = None,
) -> Path:
    """A sentence-transformers folder: mean pooling (or ``pooling``), and Normalize when
    ``normalize``; ``prompts`` and ``default_prompt_name`` go to
    ``config_sentence_transformers.json``, ``max_seq_length`` to ``sentence_bert_config.json``,
    ``model_max_length`` to the tokenizer (None: it names no limit)."""
    folder = root / name
    torch.manual_seed(1)
    transformers.BertModel(bert_config()).save_pretrained(folder)
    _tokenizer(folder, root, model_max_length)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )
    _st_files(folder, normalize, pooling, include_prompt, prompts, default_prompt_name)
    return folder


def decoder_folder(
    root: Path,
    name: str = "decoder",
    *,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """A decoder embedder as Qwen3-Embedding is made: a tiny Qwen3, a tokenizer that pads on
    the left and ends every text with its end-of-text token, lasttoken pooling, Normalize."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder = root / name
    torch.manual_seed(2)
    specials = ["<|pad|>", "<|unk|>", "<|endoftext|>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    config = transformers.Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=HIDDEN,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=POSITIONS,
        initializer_range=0.5,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=2,
    )
    transformers.Qwen3Model(config).save_pretrained(folder)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 2)]
    )
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        eos_token="<|endoftext|>",
        padding_side="left",
        model_max_length=POSITIONS,
    ).save_pretrained(folder)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": ST_MAX_SEQ, "do_lower_case": False})
    )
    _st_files(folder, True, "lasttoken", True, prompts, default_prompt_name)
    return folder


def _st_files(
    folder: Path,
    normalize: bool,
    pooling: str | list[str] | None,
    include_prompt: bool,
    prompts: dict[str, str] | None,
    default_prompt_name: str | None,
) -> None:
    (folder / "1_Pooling").mkdir()
    pooling_config: dict[str, Any] = {"word_embedding_dimension": HIDDEN}
    if pooling is None:
        pooling_config["pooling_mode_mean_tokens"] = True
    else:
        pooling_config["pooling_mode"] = pooling
    if not include_prompt:
        pooling_config["include_prompt"] = False
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    if prompts is not None or default_prompt_name is not None:
        (folder / "config_sentence_transformers.json").write_text(
            json.dumps({"prompts": prompts or {}, "default_prompt_name": default_prompt_name})
        )
    kinds = ["Transformer", "Pooling", *(["Normalize"] if normalize else [])]
    paths = {"Transformer": "", "Pooling": "1_Pooling"}
    modules = [
        {
            "idx": i,
            "name": str(i),
            "path": paths.get(kind, f"{i}_{kind}"),
            "type": f"sentence_transformers.models.{kind}",
        }
        for i, kind in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))


def encoder_folder(root: Path, name: str = "base") -> Path:
    """A bare encoder, for the feature-extraction pipeline."""
    folder = root / name
    torch.manual_seed(0)
    transformers.BertModel(bert_config()).save_pretrained(folder)
    _tokenizer(folder, root)
    return folder


def classifier_folder(
    root: Path,
    name: str,
    labels: list[str],
    seed: int = 0,
    *,
    model_max_length: int | None = None,
) -> Path:
    """A sequence classifier with ``labels`` (one label: a single-logit cross-encoder); its
    tokenizer's ``model_max_length`` (None: it names no limit)."""
    folder = root / name
    torch.manual_seed(seed)
    config = bert_config(
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)}
    )
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    _tokenizer(folder, root, model_max_length)
    return folder


def roberta_classifier_folder(root: Path, name: str, labels: list[str]) -> Path:
    """A RoBERTa sequence classifier, whose position ids start after the padding index: a
    table of ``POSITIONS + 1`` rows (pad id 0) holds :data:`POSITIONS` tokens. Its tokenizer
    names no limit."""
    folder = root / name
    torch.manual_seed(6)
    config = transformers.RobertaConfig(
        vocab_size=len(SPECIALS) + len(WORDS),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=POSITIONS + 1,
        pad_token_id=0,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    transformers.RobertaForSequenceClassification(config).save_pretrained(folder)
    _tokenizer(folder, root)
    return folder


def saved_sentence_folder(root: Path, name: str, max_seq_length: int) -> Path:
    """A sentence-transformers folder saved by sentence-transformers itself (Transformer, mean
    Pooling, Normalize) over :func:`encoder_folder`, with ``max_seq_length`` (which it keeps
    as the tokenizer's ``model_max_length``)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    encoder = encoder_folder(root, f"{name}-encoder")
    transformer = Transformer(str(encoder), max_seq_length=max_seq_length)
    folder = root / name
    SentenceTransformer(modules=[transformer, Pooling(HIDDEN, "mean"), Normalize()]).save(
        str(folder)
    )
    return folder


def masked_folder(root: Path, name: str = "masked") -> Path:
    """A masked language model (``[MASK]``), for the fill-mask pipeline."""
    folder = root / name
    torch.manual_seed(0)
    transformers.BertForMaskedLM(bert_config()).save_pretrained(folder)
    _tokenizer(folder, root)
    return folder


def sparse_encoder_folder(
    root: Path,
    name: str = "splade",
    prompts: dict[str, str] | None = None,
    max_seq_length: int = ST_MAX_SEQ,
) -> Path:
    """A sentence-transformers ``SparseEncoder`` folder (a masked-LM ``Transformer`` and
    ``SpladePooling``), built and saved with sentence-transformers' own classes."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    masked = masked_folder(root, f"{name}-mlm")
    transformer = Transformer(
        str(masked), transformer_task="fill-mask", max_seq_length=max_seq_length
    )
    encoder = SparseEncoder(
        modules=[transformer, SpladePooling(pooling_strategy="max")], prompts=prompts
    )
    folder = root / name
    encoder.save(str(folder))
    return folder


def inference_free_folder(root: Path, name: str = "inference-free", router: bool = True) -> Path:
    """A SparseEncoder folder this server refuses: inference-free SPLADE (a Router sending
    queries to ``SparseStaticEmbedding`` and documents to the masked LM), or with
    ``router=False`` ``SparseStaticEmbedding`` alone; built with sentence-transformers."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import (
        MLMTransformer,
        Router,
        SparseStaticEmbedding,
        SpladePooling,
    )

    masked = masked_folder(root, f"{name}-mlm")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(masked))
    static = SparseStaticEmbedding(tokenizer=tokenizer, frozen=False)
    if router:
        modules: list[Any] = [
            Router.for_query_document(
                query_modules=[static],
                document_modules=[MLMTransformer(str(masked)), SpladePooling()],
            )
        ]
    else:
        modules = [static]
    folder = root / name
    SparseEncoder(modules=modules).save(str(folder))
    return folder
