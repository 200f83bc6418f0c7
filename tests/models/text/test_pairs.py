"""Items with several named inputs: text pairs for cross-encoders and NLI models (KServe v2
with ``text`` and ``text_pair``, plain JSON pair items), a custom model with two named inputs,
and ``POST /v1/rerank``; on tiny offline models and a real socket."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import transformers
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from batching.app import default_model_builder
from batching.codecs.inputs import takes_pairs
from batching.codecs.openai import OpenAIError
from batching.codecs.rerank import positive_label, relevance_of
from batching.models.text.pipeline import PipelineModel
from tests.support.models import EchoModel
from tests.support.threaded import serving_in_thread
from tests.support.tiny import POSITIONS, classifier_folder, sentence_folder

QUERY = "where is the cat"
DOCUMENTS = [
    "the dog runs fast",
    "the cat sat on the mat",
    "a red house with a green tree",
    "the cat is very good",
    "i like it",
]
PAIRS = [{"text": QUERY, "text_pair": document} for document in DOCUMENTS]


class QAModel(EchoModel):
    """A custom model with two required named inputs, ``question`` and ``context``."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.batches.append(list(inputs))
        return [f"{item['question']}|{item['context']}" for item in inputs]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [
                {"name": "question", "datatype": "BYTES", "shape": [-1]},
                {"name": "context", "datatype": "BYTES", "shape": [-1]},
            ],
            "outputs": [{"name": "answer", "datatype": "BYTES", "shape": [-1]}],
        }


class OverlapScorer(EchoModel):
    """A custom pair model that scores a pair by the words its two texts share."""

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        self.batches.append(list(inputs))
        return [
            float(len(set(item["text"].split()) & set(item["text_pair"].split())))
            for item in inputs
        ]

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [-1]},
                {"name": "text_pair", "datatype": "BYTES", "shape": [-1]},
            ],
            "outputs": [{"name": "score", "datatype": "FP32", "shape": [-1, 1]}],
        }


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "ce": classifier_folder(root, "ce", ["LABEL_0"], seed=3),
        "binary": classifier_folder(root, "binary", ["irrelevant", "relevant"], seed=4),
        "unnamed": classifier_folder(root, "unnamed", ["LABEL_0", "LABEL_1"], seed=5),
        "nli": classifier_folder(root, "nli", ["contradiction", "entailment", "neutral"]),
        "st": sentence_folder(root),
    }


@pytest.fixture(scope="module")
def custom() -> dict[str, EchoModel]:
    return {"qa": QAModel(), "overlap": OverlapScorer()}


@pytest.fixture(scope="module")
def url(folders: dict[str, Path], custom: dict[str, EchoModel]) -> Iterator[str]:
    def classifier(name: str, **batching: Any) -> ModelConfig:
        return ModelConfig(
            name=name,
            source=str(folders[name]),
            task="text-classification",
            batching=BatchingConfig(**batching),
        )

    models = [
        # Token-aware batching: pairs are counted as one sequence pair each.
        classifier("ce", max_batch_size=4, max_batch_tokens=4 * POSITIONS),
        classifier("binary"),
        classifier("unnamed"),
        classifier("nli"),
        ModelConfig(name="st", source=str(folders["st"])),
        ModelConfig(name="qa", batching=BatchingConfig(max_batch_size=4)),
        ModelConfig(name="overlap", batching=BatchingConfig(max_batch_size=2)),
    ]

    def builder(config: ModelConfig) -> Any:
        return custom.get(config.name) or default_model_builder(config)

    with serving_in_thread(create_app(models, builder=builder)) as base_url:
        yield base_url


def reference(folder: Path, items: list[Any]) -> list[dict[str, float]]:
    """Every label's score for each item, from transformers' own pipeline, one item at a time."""
    pipe = transformers.pipeline("text-classification", model=str(folder), top_k=None)
    scores = []
    for item in items:
        entries = pipe(item)
        if entries and isinstance(entries[0], list):  # a text alone comes back wrapped
            entries = entries[0]
        scores.append({entry["label"]: entry["score"] for entry in entries})
    return scores


def plain(url: str, model: str, inputs: Any) -> httpx.Response:
    return httpx.post(f"{url}/models/{model}", json={"inputs": inputs}, timeout=30)


def rerank(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/rerank", json=body, timeout=30)


# --- text pairs through the v2 and plain doors -----------------------------------------------


def test_v2_takes_text_and_text_pair_through_tritonclient(
    url: str, folders: dict[str, Path]
) -> None:
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    try:
        metadata = client.get_model_metadata("binary")
        assert [tensor["name"] for tensor in metadata["inputs"]] == ["text", "text_pair"]
        inputs = []
        for name, texts in (("text", [QUERY] * len(DOCUMENTS)), ("text_pair", DOCUMENTS)):
            tensor = triton_http.InferInput(name, [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
            inputs.append(tensor)
        result = client.infer("binary", inputs)
        outputs = [orjson.loads(row[0]) for row in result.as_numpy("output")]
        alone = client.infer("binary", inputs[:1])  # text_pair is optional
        singles = [orjson.loads(row[0]) for row in alone.as_numpy("output")]
    finally:
        client.close()
    expected = reference(folders["binary"], PAIRS)
    for output, scores in zip(outputs, expected, strict=True):
        assert output["label"] == max(scores, key=scores.__getitem__)
        assert output["score"] == pytest.approx(scores[output["label"]], abs=1e-5)
    # Read as pairs, not as the query alone.
    assert singles[0]["score"] != pytest.approx(outputs[0]["score"], abs=1e-4)
    single = reference(folders["binary"], [QUERY])[0]
    assert singles[0]["score"] == pytest.approx(single[singles[0]["label"]], abs=1e-5)


@pytest.mark.parametrize(
    ("model", "tensors", "fragment"),
    [
        ("binary", {"text": ["a", "b"], "text_pair": ["c"]}, "same first dimension"),
        ("binary", {"text": ["a"], "pair": ["c"]}, "unexpected inference input"),
        ("binary", {"text_pair": ["c"]}, "'text' missing"),
        ("qa", {"question": ["who"]}, "'context' missing"),
    ],
)
def test_v2_pair_requests_are_checked(
    url: str, model: str, tensors: dict[str, list[str]], fragment: str
) -> None:
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    inputs = []
    for name, texts in tensors.items():
        tensor = triton_http.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object))
        inputs.append(tensor)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, inputs)
    finally:
        client.close()
    assert refused.value.status() == "400"
    assert fragment in refused.value.message()


def test_plain_json_pair_items(url: str, folders: dict[str, Path]) -> None:
    items: list[Any] = [*PAIRS[:2], "a lone text", {"text": "only the text"}]
    answer = plain(url, "nli", items)
    assert answer.status_code == 200, answer.text
    expected = reference(folders["nli"], [*PAIRS[:2], "a lone text", "only the text"])
    for output, scores in zip(answer.json()["outputs"], expected, strict=True):
        assert output["score"] == pytest.approx(max(scores.values()), abs=1e-5)
    for bad, fragment in [
        ({"text": "a", "pair": "b"}, "unknown input 'pair'"),
        ({"text": "a", "text_pair": 3}, "inputs[0].text_pair is int"),
        ({"text_pair": "b"}, "lacks the input 'text'"),
        (7, "inputs[0].text is int"),
    ]:
        refused = plain(url, "nli", [bad])
        assert refused.status_code == 422, refused.text
        assert fragment in refused.json()["error"]


def test_a_custom_model_gets_its_named_inputs_as_a_dict(
    url: str, custom: dict[str, EchoModel]
) -> None:
    answer = plain(url, "qa", [{"question": "who", "context": "the cat"}])
    assert answer.json()["outputs"] == ["who|the cat"]
    assert {"question": "who", "context": "the cat"} in custom["qa"].batches[-1]
    lone = plain(url, "qa", ["who"])  # both inputs are required: a lone text is not enough
    assert lone.status_code == 422 and "named inputs 'question', 'context'" in lone.text


def test_a_request_over_max_batch_size_is_split_and_rejoined_in_order(
    url: str, custom: dict[str, EchoModel]
) -> None:
    model = custom["qa"]
    questions = [f"q{index}" for index in range(11)]
    contexts = [f"c{index}" for index in range(11)]
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    try:
        inputs = []
        for name, texts in (("question", questions), ("context", contexts)):
            tensor = triton_http.InferInput(name, [len(texts)], "BYTES")
            tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=True)
            inputs.append(tensor)
        before = len(model.batches)
        result = client.infer("qa", inputs)
    finally:
        client.close()
    answers = [row.decode() for row in result.as_numpy("answer").reshape(-1)]
    assert answers == [f"q{index}|c{index}" for index in range(11)]
    batches = model.batches[before:]
    assert len(batches) >= 3 and all(len(batch) <= 4 for batch in batches)
    assert [item for batch in batches for item in batch] == [
        {"question": q, "context": c} for q, c in zip(questions, contexts, strict=True)
    ]


def test_pairs_are_counted_as_one_sequence_pair(folders: dict[str, Path]) -> None:
    model = PipelineModel("text-classification", folders["ce"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["ce"]))
    pair = {"text": QUERY, "text_pair": DOCUMENTS[1]}
    assert model.count_tokens(pair) == len(tokenizer(QUERY, DOCUMENTS[1])["input_ids"])
    assert model.count_tokens({"text": QUERY}) == model.count_tokens(QUERY)
    long = {"text": " ".join(["the cat"] * 50), "text_pair": " ".join(["a dog"] * 50)}
    assert model.count_tokens(long) == POSITIONS  # truncated longest-first, as predicted
    assert model.token_length(long, 10_000) == 203  # [CLS] 100 [SEP] 100 [SEP]
    assert model.count_tokens({"text": "a", "bad": "b"}) == 1
    metadata = model.metadata()
    assert takes_pairs(metadata) and metadata["labels"] == ["LABEL_0"]
    assert metadata["inputs"][1] == {
        "name": "text_pair",
        "datatype": "BYTES",
        "shape": [-1],
        "optional": True,
    }


# --- /v1/rerank ------------------------------------------------------------------------------


def test_rerank_orders_best_first_with_top_n_and_documents(url: str) -> None:
    documents = ["x", "where cat", "is the cat where", "the", "where is the cat"]
    answer = rerank(url, model="overlap", query=QUERY, documents=documents)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "overlap"
    assert [r["index"] for r in body["results"]] == [2, 4, 1, 3, 0]  # ties in document order
    assert [r["relevance_score"] for r in body["results"]] == [4.0, 4.0, 2.0, 1.0, 0.0]
    assert all("document" not in result for result in body["results"])
    assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0}  # no tokenizer to count

    top = rerank(
        url,
        model="overlap",
        query=QUERY,
        documents=[{"text": text} for text in documents],
        top_n=2,
        return_documents=True,
    ).json()["results"]
    assert top == [
        {"index": 2, "relevance_score": 4.0, "document": {"text": "is the cat where"}},
        {"index": 4, "relevance_score": 4.0, "document": {"text": "where is the cat"}},
    ]
    assert (
        len(rerank(url, model="overlap", query="q", documents=["a"], top_n=9).json()["results"])
        == 1
    )


def test_rerank_with_a_single_logit_cross_encoder(url: str, folders: dict[str, Path]) -> None:
    answer = rerank(url, model="ce", query=QUERY, documents=DOCUMENTS)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    scores = [pair["LABEL_0"] for pair in reference(folders["ce"], PAIRS)]  # sigmoid(logit)
    expected_order = sorted(range(len(DOCUMENTS)), key=lambda index: -scores[index])
    assert [result["index"] for result in body["results"]] == expected_order
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], abs=1e-5)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["ce"]))
    tokens = sum(len(tokenizer(QUERY, document)["input_ids"]) for document in DOCUMENTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


@pytest.mark.parametrize(("model", "positive"), [("binary", "relevant"), ("unnamed", "LABEL_1")])
def test_rerank_with_two_labels_scores_the_positive_one(
    url: str, folders: dict[str, Path], model: str, positive: str
) -> None:
    body = rerank(url, model=model, query=QUERY, documents=DOCUMENTS).json()
    scores = [pair[positive] for pair in reference(folders[model], PAIRS)]
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], abs=1e-5)
    ranked = [result["relevance_score"] for result in body["results"]]
    assert ranked == sorted(ranked, reverse=True)


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "nli", "query": "q", "documents": ["a"]}, 400, "model", "model_not_supported"),
        ({"model": "st", "query": "q", "documents": ["a"]}, 404, "model", "model_not_found"),
        ({"model": "nope", "query": "q", "documents": ["a"]}, 404, "model", "model_not_found"),
        ({"model": "ce", "documents": ["a"]}, 400, "query", "missing_required_parameter"),
        ({"model": "ce", "query": "q", "documents": []}, 400, "documents", "invalid_value"),
        ({"model": "ce", "query": "q", "documents": [1]}, 400, "documents", "invalid_type"),
        ({"model": "ce", "query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n", None),
    ],
)
def test_rerank_errors_use_openais_shape(
    url: str, body: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    answer = httpx.post(f"{url}/v1/rerank", json=body, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


# --- how a relevance score is read -----------------------------------------------------------


def test_relevance_of_each_output_form() -> None:
    assert relevance_of(0.25, [], "m") == 0.25
    assert relevance_of(np.array([1.5], dtype=np.float32), [], "m") == 1.5
    assert relevance_of({"label": "LABEL_0", "score": 0.75}, ["LABEL_0"], "m") == 0.75
    two = ["not_entailment", "entailment"]
    assert relevance_of({"label": "entailment", "score": 0.75}, two, "m") == 0.75
    assert relevance_of({"label": "not_entailment", "score": 0.75}, two, "m") == 0.25
    rte = ["entailment", "not_entailment"]  # the positive label need not come second
    assert relevance_of({"label": "entailment", "score": 0.75}, rte, "m") == 0.75
    every = [{"label": "neutral", "score": 0.5}, {"label": "entailment", "score": 0.3}]
    assert relevance_of(every, ["contradiction", "entailment", "neutral"], "m") == 0.3
    assert relevance_of(every, [], "m") == 0.3
    with pytest.raises(OpenAIError, match="3 labels"):
        relevance_of({"label": "entailment", "score": 0.9}, ["c", "entailment", "n"], "m")
    with pytest.raises(OpenAIError, match="not a score"):
        relevance_of("yes", [], "m")
    assert positive_label(["NEGATIVE", "POSITIVE"]) == "POSITIVE"
    assert positive_label(["a", "b", "c"]) is None
