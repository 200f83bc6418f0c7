"""Sparse (SPLADE) embeddings: a sentence-transformers SparseEncoder folder, and a bare
masked LM with ``--task sparse-embedding``, served through ``POST /embed_sparse`` and the
KServe v2 door (tritonclient over HTTP and gRPC), equal to sentence-transformers'
``SparseEncoder.encode`` on tiny offline models; the options' 400s, the OpenAI door that
does not take them, and the folders refused at start."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from batching.keys import ApiKeys
from batching.models.source import ModelSource, ModelSourceError
from batching.settings.cli import parse_settings
from tests.support.metrics import sample
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread
from tests.support.tiny import (
    ST_MAX_SEQ,
    encoder_folder,
    inference_free_folder,
    masked_folder,
    sentence_folder,
    sparse_encoder_folder,
)
from tests.support.tolerance import assert_torch_close

PROMPTS = {"query": "what is ", "document": ""}
TEXTS = [
    "the cat sat on the mat",
    "a dog",
    # Over the folder's 16 tokens: truncated, at the end or (when asked) at the start.
    "what where who eats fish and the red house runs fast while the blue tree sleeps slow",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse")
    return {
        "splade": sparse_encoder_folder(root, prompts=PROMPTS),
        "mlm": masked_folder(root, "mlm"),
        "st": sentence_folder(root),
    }


@pytest.fixture(scope="module")
def served(folders: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """One server for the module: HTTP base URL and gRPC target."""
    small = BatchingConfig(max_batch_size=4, max_items_per_request=8)
    models = [
        ModelConfig(name="st", source=str(folders["st"]), engine="torch"),
        ModelConfig(name="splade", source=str(folders["splade"]), engine="torch", batching=small),
        ModelConfig(
            name="mlm", source=str(folders["mlm"]), task="sparse-embedding", engine="torch"
        ),
    ]
    port = free_port()
    with serving_in_thread(create_app(models, grpc_port=port)) as url:
        yield url, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def url(served: tuple[str, str]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> SparseEncoder:
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    return SparseEncoder(str(folders["splade"]), device="cpu")


def rows(encoded: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """sentence-transformers' sparse tensors as (indices, values) per text."""
    dense = encoded.to_dense() if encoded.is_sparse else encoded
    out = []
    for row in dense.cpu().numpy():
        indices = np.flatnonzero(row)
        out.append((indices, row[indices]))
    return out


def assert_equal(got: list[tuple[np.ndarray, np.ndarray]], want: list[Any]) -> None:
    assert len(got) == len(want)
    for (indices, values), (ref_indices, ref_values) in zip(got, want, strict=True):
        np.testing.assert_array_equal(indices, ref_indices)
        assert_torch_close(values, ref_values)  # another batch sums in another order


def differs(first: list[Any], second: list[Any]) -> bool:
    """Whether two lists of (indices, values) rows are not the same vectors."""
    return any(
        not np.array_equal(a[0], b[0]) or not np.allclose(a[1], b[1])
        for a, b in zip(first, second, strict=True)
    )


def embed_sparse(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/embed_sparse", json=body, timeout=30)


def tei_rows(answer: httpx.Response) -> list[tuple[np.ndarray, np.ndarray]]:
    assert answer.status_code == 200, answer.text
    out = []
    for entries in answer.json():
        indices = np.array([entry["index"] for entry in entries], dtype=np.int64)
        values = np.array([entry["value"] for entry in entries], dtype=np.float32)
        assert list(indices) == sorted(indices)
        assert (values != 0).all()
        out.append((indices, values))
    return out


# --- /embed_sparse --------------------------------------------------------------------------


def test_embed_sparse_equals_the_sparse_encoder(url: str, reference: SparseEncoder) -> None:
    want = rows(reference.encode(TEXTS))
    assert_equal(tei_rows(embed_sparse(url, {"inputs": TEXTS, "model": "splade"})), want)
    # The first sparse model answers when the body names none; a lone string is one text.
    assert_equal(tei_rows(embed_sparse(url, {"inputs": TEXTS[0]})), want[:1])


def test_prompt_name_and_left_truncation_equal_the_sparse_encoder(
    url: str, reference: SparseEncoder
) -> None:
    asked = {"inputs": TEXTS, "model": "splade", "prompt_name": "query"}
    want = rows(reference.encode(TEXTS, prompt_name="query"))
    assert_equal(tei_rows(embed_sparse(url, asked)), want)
    by_type = {"inputs": TEXTS, "model": "splade", "input_type": "search_query"}
    assert_equal(tei_rows(embed_sparse(url, by_type)), want)
    assert differs(want, rows(reference.encode(TEXTS)))
    left = left_truncated(reference, TEXTS)
    body = {"inputs": TEXTS, "model": "splade", "truncation_direction": "left"}
    assert_equal(tei_rows(embed_sparse(url, body)), left)
    assert differs(left[2:], rows(reference.encode(TEXTS[2:])))


def test_return_tokens_names_each_index(url: str, reference: SparseEncoder) -> None:
    answer = embed_sparse(url, {"inputs": TEXTS[:2], "model": "splade", "return_tokens": True})
    assert answer.status_code == 200, answer.text
    for entries in answer.json():
        assert entries and all(set(entry) == {"index", "value", "token"} for entry in entries)
        ids = [entry["index"] for entry in entries]
        assert [entry["token"] for entry in entries] == reference.tokenizer.convert_ids_to_tokens(
            ids
        )
    plain = embed_sparse(url, {"inputs": TEXTS[:1], "model": "splade"}).json()
    assert all(set(entry) == {"index", "value"} for entry in plain[0])


def test_task_sparse_embedding_on_a_masked_lm_equals_mlm_transformer_and_splade_pooling(
    url: str, folders: dict[str, Path]
) -> None:
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    encoder = SparseEncoder(
        modules=[MLMTransformer(str(folders["mlm"])), SpladePooling("max")], device="cpu"
    )
    want = rows(encoder.encode(TEXTS))
    assert_equal(tei_rows(embed_sparse(url, {"inputs": TEXTS, "model": "mlm"})), want)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (
            {"inputs": ["a"], "model": "splade", "normalize": True},
            400,
            "unknown option 'normalize'",
        ),
        ({"inputs": ["a"], "model": "splade", "truncate": "yes"}, 400, "truncate must be"),
        ({"inputs": ["a"], "model": "splade", "truncation_direction": "up"}, 400, "truncation"),
        ({"inputs": ["a"], "model": "splade", "prompt_name": "nope"}, 400, "'query'"),
        ({"inputs": ["a"], "model": "splade", "return_tokens": 1}, 400, "return_tokens"),
        ({"inputs": ["a"], "model": "splade", "dimensions": 8}, 400, "dimensions does not apply"),
        ({"inputs": ["a"], "model": "splade", "encoding": "int8"}, 400, "encoding does not"),
        ({"inputs": ["a"], "model": "splade", "input_type": "image"}, 400, "input_type 'image'"),
        ({"inputs": ["a"], "model": "mlm", "prompt_name": "query"}, 400, "prompts: none"),
        ({"inputs": [], "model": "splade"}, 400, "empty"),
        ({"model": "splade"}, 400, '"inputs"'),
        ({"inputs": ["a"], "model": "st"}, 400, "the sparse models served: 'splade', 'mlm'"),
        ({"inputs": ["a"], "model": "nope"}, 404, "the sparse models served: 'splade', 'mlm'"),
        ({"inputs": [1], "model": "splade"}, 422, "inputs[0]"),
        ({"inputs": ["a"] * 9, "model": "splade"}, 413, ""),
        ({"inputs": [TEXTS[2]], "model": "splade", "truncate": False}, 413, "16 tokens"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_error(
    url: str, body: dict[str, Any], status: int, says: str
) -> None:
    answer = embed_sparse(url, body)
    assert answer.status_code == status, answer.text
    assert says in answer.json()["error"]


def test_truncate_false_serves_texts_within_the_limit(url: str, reference: SparseEncoder) -> None:
    answer = embed_sparse(url, {"inputs": TEXTS[:2], "model": "splade", "truncate": False})
    assert_equal(tei_rows(answer), rows(reference.encode(TEXTS[:2])))
    # Counted with the prompt: the text fits alone, not with the query prompt before it.
    fits = "the cat sat on the mat and the dog sat on it very"
    assert len(reference.tokenizer(fits)["input_ids"]) <= ST_MAX_SEQ
    with_prompt = {"inputs": [fits], "model": "splade", "truncate": False, "prompt_name": "query"}
    assert embed_sparse(url, {**with_prompt, "prompt_name": None}).status_code == 200
    before = sample(
        httpx.get(f"{url}/metrics").text,
        "batching_rejected_total",
        0.0,
        model="splade",
        reason="too_large",
    )
    assert embed_sparse(url, with_prompt).status_code == 413
    after = sample(
        httpx.get(f"{url}/metrics").text,
        "batching_rejected_total",
        0.0,
        model="splade",
        reason="too_large",
    )
    assert after == before + 1


def test_the_plain_door_answers_each_vector_as_an_object(
    url: str, reference: SparseEncoder
) -> None:
    answer = httpx.post(f"{url}/models/splade", json={"inputs": TEXTS[:2]}, timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    assert all(set(output) == {"indices", "values", "tokens"} for output in outputs)
    got = [(np.array(o["indices"]), np.array(o["values"], dtype=np.float32)) for o in outputs]
    assert_equal(got, rows(reference.encode(TEXTS[:2])))
    # The options beside "inputs", as on /embed_sparse.
    asked = {"inputs": TEXTS, "prompt_name": "query", "truncation_direction": "left"}
    answer = httpx.post(f"{url}/models/splade", json=asked, timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    got = [(np.array(o["indices"]), np.array(o["values"], dtype=np.float32)) for o in outputs]
    want = left_kept(reference, TEXTS, PROMPTS["query"])
    assert_equal(got, want)
    # The short texts are not cut: they equal encode(prompt_name="query").
    assert_equal(want[:2], rows(reference.encode(TEXTS[:2], prompt_name="query")))
    # The long one keeps its prompt and its end.
    assert differs(want[2:], left_truncated(reference, [PROMPTS["query"] + TEXTS[2]]))
    refused = httpx.post(f"{url}/models/splade", json={"inputs": TEXTS, "truncate": False})
    assert refused.status_code == 413 and "16 tokens" in refused.json()["error"]
    unknown = httpx.post(f"{url}/models/splade", json={"inputs": TEXTS, "normalize": False})
    assert unknown.status_code == 400 and "normalize" in unknown.json()["error"]


def test_the_door_keeps_the_limits_and_headers_of_every_door(url: str) -> None:
    body = {"inputs": TEXTS[:1], "model": "splade"}
    answer = httpx.post(f"{url}/embed_sparse", json=body, headers={"x-request-id": "sparse-1"})
    assert answer.status_code == 200 and answer.headers["x-request-id"] == "sparse-1"
    bad_timeout = httpx.post(
        f"{url}/embed_sparse", json=body, headers={"x-request-timeout-ms": "soon"}
    )
    assert bad_timeout.status_code == 400 and "x-request-timeout-ms" in bad_timeout.text
    huge = httpx.post(f"{url}/embed_sparse", json={"inputs": ["a" * (2 << 20)]}, timeout=30)
    assert huge.status_code == 413 and "byte limit" in huge.json()["error"]
    wrong_method = httpx.get(f"{url}/embed_sparse")
    assert wrong_method.status_code == 405


# --- KServe v2 ------------------------------------------------------------------------------


def padded_rows(indices: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    assert indices.dtype == np.int64 and values.dtype == np.float32
    assert indices.shape == values.shape and indices.ndim == 2
    out = []
    for row_indices, row_values in zip(indices, values, strict=True):
        real = row_indices >= 0
        count = int(real.sum())
        # The non-zeros first, then index -1 with value 0.
        assert real[:count].all() and not real[count:].any()
        assert (row_values[count:] == 0).all()
        out.append((row_indices[real], row_values[real]))
    return out


def test_v2_http_answers_indices_and_values(url: str, reference: SparseEncoder) -> None:
    want = rows(reference.encode(TEXTS))
    with httpclient.InferenceServerClient(url.removeprefix("http://")) as client:
        metadata = client.get_model_metadata("splade")
        assert [(o["name"], o["datatype"], o["shape"]) for o in metadata["outputs"]] == [
            ("indices", "INT64", [-1, -1]),
            ("values", "FP32", [-1, -1]),
        ]
        assert metadata["sparse"]["padding"] == {"indices": -1, "values": 0.0}
        for binary in (False, True):
            text = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
            text.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=binary)
            outputs = [
                httpclient.InferRequestedOutput(name, binary_data=binary)
                for name in ("indices", "values")
            ]
            result = client.infer("splade", [text], outputs=outputs)
            got = padded_rows(result.as_numpy("indices"), result.as_numpy("values"))
            assert_equal(got, want)
            assert result.as_numpy("indices").shape[1] == max(len(i) for i, _ in want)


def test_v2_grpc_answers_indices_and_values(
    served: tuple[str, str], reference: SparseEncoder, folders: dict[str, Path]
) -> None:
    want = rows(reference.encode(TEXTS))
    with grpcclient.InferenceServerClient(served[1]) as client:
        metadata = client.get_model_metadata("splade")
        assert [(o.name, o.datatype) for o in metadata.outputs] == [
            ("indices", "INT64"),
            ("values", "FP32"),
        ]
        config = client.get_model_config("splade").config
        sparse = json.loads(config.parameters["sparse"].string_value)
        assert sparse["padding"] == {"indices": -1, "values": 0.0} and sparse["vocab_size"] > 0
        text = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object))
        result = client.infer("splade", [text])
        assert_equal(padded_rows(result.as_numpy("indices"), result.as_numpy("values")), want)
        one = grpcclient.InferInput("text", [1], "BYTES")
        one.set_data_from_numpy(np.array(TEXTS[1:2], dtype=object))
        result = client.infer("mlm", [one])
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    encoder = SparseEncoder(
        modules=[MLMTransformer(str(folders["mlm"])), SpladePooling("max")], device="cpu"
    )
    got = padded_rows(result.as_numpy("indices"), result.as_numpy("values"))
    assert_equal(got, rows(encoder.encode(TEXTS[1:2])))


def left_truncated(reference: SparseEncoder, texts: list[str]) -> list[Any]:
    tokenizer = reference.tokenizer
    tokenizer.truncation_side = "left"
    try:
        return rows(reference.encode(texts))
    finally:
        tokenizer.truncation_side = "right"


def left_kept(reference: SparseEncoder, texts: list[str], prompt: str) -> list[Any]:
    """SparseEncoder's own modules on the tokens a cut at the start keeps when the text has
    a prompt: [CLS], the prompt, the text's last tokens, [SEP] (the prompt is not cut)."""
    tokenizer = reference.tokenizer
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    kept_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    out = []
    for text in texts:
        ids = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
        room = ST_MAX_SEQ - 2 - kept_prompt
        if len(ids) + 2 > ST_MAX_SEQ:
            ids = ids[:kept_prompt] + ids[len(ids) - room :]
        row = torch.tensor([[cls, *ids, sep]])
        features = {
            "input_ids": row,
            "attention_mask": torch.ones_like(row),
            "token_type_ids": torch.zeros_like(row),
        }
        with torch.inference_mode():
            out.extend(rows(reference(features)["sentence_embedding"]))
    return out


def test_v2_takes_the_options_as_parameters_over_http_and_grpc(
    served: tuple[str, str], reference: SparseEncoder
) -> None:
    url, target = served
    query = rows(reference.encode(TEXTS, prompt_name="query"))
    left = left_truncated(reference, TEXTS)
    with httpclient.InferenceServerClient(url.removeprefix("http://")) as client:
        text = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object))
        asked = client.infer("splade", [text], parameters={"prompt_name": "query"})
        assert_equal(padded_rows(asked.as_numpy("indices"), asked.as_numpy("values")), query)
        with pytest.raises(InferenceServerException, match="unknown prompt_name 'nope'") as bad:
            client.infer("splade", [text], parameters={"prompt_name": "nope"})
        assert bad.value.status() == "400"
        with pytest.raises(InferenceServerException, match="16 tokens") as long:
            client.infer("splade", [text], parameters={"truncate": False})
        assert long.value.status() == "413"
    with grpcclient.InferenceServerClient(target) as client:
        text = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object))
        result = client.infer("splade", [text], parameters={"truncation_direction": "left"})
        assert_equal(padded_rows(result.as_numpy("indices"), result.as_numpy("values")), left)
        with pytest.raises(InferenceServerException, match="truncation_direction"):
            client.infer("splade", [text], parameters={"truncation_direction": "up"})
        with pytest.raises(InferenceServerException, match="16 tokens"):
            client.infer("splade", [text], parameters={"truncate": False})


# --- the OpenAI door ------------------------------------------------------------------------


def test_the_openai_door_lists_a_sparse_model_as_sparse_and_does_not_serve_it(url: str) -> None:
    listed = {model["id"]: model for model in httpx.get(f"{url}/v1/models").json()["data"]}
    assert "/v1/embeddings" in listed["st"]["endpoints"]
    assert "/embed_sparse" in listed["splade"]["endpoints"]
    assert "/v1/embeddings" not in listed["splade"]["endpoints"]
    answer = httpx.post(f"{url}/v1/embeddings", json={"model": "splade", "input": "a cat"})
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "model_not_found"


# --- refused at start -----------------------------------------------------------------------


def test_unsupported_sparse_folders_are_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    routed = inference_free_folder(tmp_path)
    static = inference_free_folder(tmp_path, "static", router=False)
    for folder, says in ((routed, "Router"), (static, "SparseStaticEmbedding")):
        with pytest.raises(ModelSourceError, match=f"SparseEncoder made of {says}"):
            ModelSource.parse(str(folder))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            parse_settings(["--model", str(folder)], environ={})
        assert exited.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert (
            len(lines) == 1
            and "only a masked-LM transformer followed by SpladePooling" in (lines[0])
        )
    encoder = encoder_folder(tmp_path)
    with pytest.raises(ModelSourceError, match="BertModel, not a masked language model"):
        ModelSource.parse(str(encoder), "sparse-embedding")


def test_sparse_sources_are_detected_without_a_task(folders: dict[str, Path]) -> None:
    assert ModelSource.parse(str(folders["splade"])).kind == "sparse"
    assert ModelSource.parse(str(folders["mlm"]), "sparse-embedding").kind == "sparse"
    assert ModelSource.parse(str(folders["st"])).kind == "sentence-transformers"
    assert ModelSource.parse(str(folders["mlm"]), "fill-mask").kind == "pipeline"


def test_the_model_matches_on_any_batch_composition(
    folders: dict[str, Path], reference: SparseEncoder
) -> None:
    from batching.models.embedding.sparse import SparseEmbedder
    from batching.models.items import EmbedItem, SparseVector

    model = SparseEmbedder(folders["splade"])
    model.load("cpu")
    items: list[Any] = [
        TEXTS[2],
        EmbedItem(TEXTS[2], truncate_left=True, output="sparse"),
        EmbedItem(TEXTS[0], prompt=PROMPTS["query"], output="sparse"),
        TEXTS[1],
    ]
    outputs = model.predict(items)
    assert all(isinstance(output, SparseVector) for output in outputs)
    got = [(output.indices, output.values) for output in outputs]
    assert_equal([got[0], got[3]], rows(reference.encode([TEXTS[2], TEXTS[1]])))
    assert_equal([got[2]], rows(reference.encode(TEXTS[:1], prompt_name="query")))
    assert model.count_tokens(items[2]) == len(
        reference.tokenizer(PROMPTS["query"] + TEXTS[0])["input_ids"]
    )
    assert model.token_length(TEXTS[2], 1000) > ST_MAX_SEQ == model.count_tokens(TEXTS[2])
    assert model._plan is not None
    model.unload()  # its plan's background threads stop
    assert model._plan.closed.is_set()


def test_a_process_instance_serves_the_same_vectors(
    folders: dict[str, Path], reference: SparseEncoder
) -> None:
    config = ModelConfig(
        name="splade", source=str(folders["splade"]), engine="torch", instance_kind="process"
    )
    with serving_in_thread(create_app([config]), timeout=120) as base:
        answer = embed_sparse(base, {"inputs": TEXTS, "return_tokens": True})
    assert_equal(tei_rows(answer), rows(reference.encode(TEXTS)))


def test_api_keys_guard_the_sparse_door(folders: dict[str, Path]) -> None:
    key = "sk-sparse-0123456789abcdef"
    config = ModelConfig(
        name="mlm", source=str(folders["mlm"]), task="sparse-embedding", engine="torch"
    )
    app = create_app([config], api_keys=ApiKeys([key]))
    with serving_in_thread(app) as base:
        body = {"inputs": TEXTS[:1]}
        refused = httpx.post(f"{base}/embed_sparse", json=body)
        allowed = httpx.post(
            f"{base}/embed_sparse", json=body, headers={"authorization": f"Bearer {key}"}
        )
    assert refused.status_code == 401
    assert allowed.status_code == 200 and allowed.json()[0]
