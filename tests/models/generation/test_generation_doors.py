"""The generating tasks through every door of a real server on 127.0.0.1: plain JSON
``parameters``, KServe v2 over HTTP (tritonclient.http) and over gRPC (tritonclient.grpc).
A tiny GPT-2 whose tokenizer has no pad token (text-generation), a tiny T5 (translation) and
a tiny BART (text2text-generation), built from a config."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batching import BatchingConfig, ModelConfig, create_app
from tests.support.generators import (
    GPT2_POSITIONS,
    SEQ2SEQ_MAX_INPUT,
    bart_folder,
    causal_reference,
    completion_of,
    direct,
    direct_seq2seq,
    gpt2_folder,
    t5_folder,
)
from tests.support.metrics import sample
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

WORDS4 = ("sat", "runs fast", "on the mat", "green")
PROMPTS = [f"{a} {b}" for a in ("the cat", "a dog", "who eats fish", "i like") for b in WORDS4]
LONG = " ".join(["the cat sat on the mat"] * 12)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generators")
    return {"gpt2": gpt2_folder(root), "t5": t5_folder(root), "bart": bart_folder(root)}


@pytest.fixture(scope="module")
def server(folders: dict[str, Path]) -> Iterator[tuple[str, str]]:
    # A window long enough that concurrent requests share batches on a busy machine.
    batching = BatchingConfig(max_batch_size=16, max_queue_delay=0.05)
    configs = [
        ModelConfig(
            name="gpt2", source=str(folders["gpt2"]), task="text-generation", batching=batching
        ),
        ModelConfig(
            name="gpt2-short",
            source=str(folders["gpt2"]),
            task="text-generation",
            parameters=(("max_new_tokens", 3), ("return_full_text", False)),
        ),
        ModelConfig(name="t5", source=str(folders["t5"]), task="translation_en_to_fr"),
        ModelConfig(
            name="bart", source=str(folders["bart"]), task="text2text-generation", batching=batching
        ),
    ]
    port = free_port()
    app = create_app(configs, grpc_port=port)
    with serving_in_thread(app, timeout=120) as url:
        yield url, f"127.0.0.1:{port}"


def generate(url: str, model: str, prompt: str, **parameters: Any) -> Any:
    answer = httpx.post(
        f"{url}/models/{model}", json={"inputs": [prompt], "parameters": parameters}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    return output


def test_single_answers_equal_generate_and_16_concurrent_equal_them(
    server: tuple[str, str], folders: dict[str, Path]
) -> None:
    url, _ = server
    reference = causal_reference(folders["gpt2"])
    tokenizer = reference[0]
    singles = [generate(url, "gpt2", p, max_new_tokens=6) for p in PROMPTS]
    for prompt, single in zip(PROMPTS[:4], singles, strict=False):
        ids = tokenizer(prompt)["input_ids"]
        expected = prompt + completion_of(reference, ids, direct(reference, ids, max_new_tokens=6))
        assert single == {"generated_text": expected}
    metrics = httpx.get(f"{url}/metrics").text
    batches = sample(metrics, "batching_batch_size_items_count", model="gpt2")
    items = sample(metrics, "batching_batch_size_items_sum", model="gpt2")
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: generate(url, "gpt2", p, max_new_tokens=6), PROMPTS))
    assert together == singles
    metrics = httpx.get(f"{url}/metrics").text
    ran = sample(metrics, "batching_batch_size_items_count", model="gpt2") - batches
    assert sample(metrics, "batching_batch_size_items_sum", model="gpt2") - items == 16
    assert ran < 16  # some batch held more than one request


def test_a_seed_gives_the_same_text_alone_or_among_concurrent_requests(
    server: tuple[str, str],
) -> None:
    url, _ = server
    sampled = {"do_sample": True, "top_k": 40, "max_new_tokens": 8}
    alone = generate(url, "gpt2", "the cat", seed=5, **sampled)
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda n: generate(url, "gpt2", "the cat", seed=5 + n % 2, **sampled), range(16)
            )
        )
    assert answers[::2] == [alone] * 8
    assert generate(url, "gpt2", "the cat", seed=6, **sampled) == answers[1]


def test_parameters_on_the_v2_http_and_grpc_doors_equal_the_plain_ones(
    server: tuple[str, str],
) -> None:
    url, target = server
    plain = generate(url, "gpt2", "the cat", max_new_tokens=7, return_full_text=False)
    stop = plain["generated_text"][2:4]
    cut = generate(url, "gpt2", "the cat", max_new_tokens=7, return_full_text=False, stop=[stop])
    assert cut["generated_text"] == plain["generated_text"][: plain["generated_text"].find(stop)]
    parameters = {"max_new_tokens": 7, "return_full_text": False}

    http = triton_http.InferenceServerClient(url.removeprefix("http://"))
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["the cat"], dtype=object))
    result = http.infer("gpt2", [text], parameters=parameters)
    assert [json.loads(row) for row in result.as_numpy("output").ravel()] == [plain]
    result = http.infer("gpt2", [text], parameters={**parameters, "stop": [stop]})
    assert [json.loads(row) for row in result.as_numpy("output").ravel()] == [cut]
    http.close()

    grpc = triton_grpc.InferenceServerClient(target)
    text = triton_grpc.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["the cat"]], dtype=object))
    result = grpc.infer("gpt2", [text], parameters=parameters, client_timeout=60)
    assert [json.loads(row) for row in result.as_numpy("output").ravel()] == [plain]
    # gRPC parameters are scalars: a list travels as a string holding a JSON array.
    result = grpc.infer(
        "gpt2", [text], parameters={**parameters, "stop": json.dumps([stop])}, client_timeout=60
    )
    assert [json.loads(row) for row in result.as_numpy("output").ravel()] == [cut]
    grpc.close()


def test_repository_defaults_apply_and_a_request_overrides_them(
    server: tuple[str, str],
) -> None:
    url, _ = server
    short = generate(url, "gpt2-short", "a dog")
    assert short == generate(url, "gpt2", "a dog", max_new_tokens=3, return_full_text=False)
    assert generate(url, "gpt2-short", "a dog", return_full_text=True)["generated_text"] == (
        "a dog" + short["generated_text"]
    )


def test_a_long_prompt_is_cut_or_a_413_naming_the_limit_on_every_door(
    server: tuple[str, str],
) -> None:
    url, target = server
    assert generate(url, "gpt2", LONG, max_new_tokens=4)["generated_text"].startswith(LONG)
    limit = f"at most {GPT2_POSITIONS - 4}"
    refused = httpx.post(
        f"{url}/models/gpt2",
        json={"inputs": [LONG], "parameters": {"max_new_tokens": 4, "truncate": False}},
    )
    assert refused.status_code == 413 and limit in refused.json()["error"]
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [LONG]}],
        "parameters": {"max_new_tokens": 4, "truncate": False},
    }
    refused = httpx.post(f"{url}/v2/models/gpt2/infer", json=body)
    assert refused.status_code == 413 and limit in refused.json()["error"]
    grpc = triton_grpc.InferenceServerClient(target)
    text = triton_grpc.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[LONG]], dtype=object))
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("gpt2", [text], parameters={"max_new_tokens": 4, "truncate": False})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert limit in str(caught.value.message())
    grpc.close()


def test_every_item_of_a_plain_request_is_its_own_sequence_and_a_refusal_names_its_place(
    server: tuple[str, str],
) -> None:
    url, _ = server
    alone = [generate(url, "gpt2", p, max_new_tokens=5) for p in PROMPTS[:3]]
    body = {"inputs": PROMPTS[:3], "parameters": {"max_new_tokens": 5}}
    together = httpx.post(f"{url}/models/gpt2", json=body, timeout=60)
    assert together.status_code == 200 and together.json()["outputs"] == alone
    body = {"inputs": ["a dog", LONG], "parameters": {"max_new_tokens": 4, "truncate": False}}
    refused = httpx.post(f"{url}/models/gpt2", json=body, timeout=60)
    assert refused.status_code == 413 and "inputs[1] has" in refused.json()["error"]
    metrics = httpx.get(f"{url}/metrics").text
    assert sample(metrics, "batching_generation_sequences", model="gpt2") == 0


BAD = [
    ({"max_tokens": 5}, "'max_tokens'"),
    ({"max_new_tokens": "5"}, "'max_new_tokens'"),
    ({"max_new_tokens": -1}, "'max_new_tokens'"),
    ({"max_new_tokens": GPT2_POSITIONS}, "'max_new_tokens'"),
    ({"temperature": "hot"}, "'temperature'"),
    ({"top_p": 1.5}, "'top_p'"),
    ({"seed": -3}, "'seed'"),
    ({"do_sample": "yes"}, "'do_sample'"),
]


@pytest.mark.parametrize(("parameters", "named"), BAD)
def test_bad_parameters_are_a_400_with_a_json_body_on_every_door(
    server: tuple[str, str], parameters: dict[str, Any], named: str
) -> None:
    url, target = server
    plain = httpx.post(f"{url}/models/gpt2", json={"inputs": ["a"], "parameters": parameters})
    assert plain.status_code == 400 and named in plain.json()["error"]
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
        "parameters": parameters,
    }
    v2 = httpx.post(f"{url}/v2/models/gpt2/infer", json=body)
    assert v2.status_code == 400 and named in v2.json()["error"]
    grpc = triton_grpc.InferenceServerClient(target)
    text = triton_grpc.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["a"]], dtype=object))
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("gpt2", [text], parameters=parameters)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert named in str(caught.value.message())
    grpc.close()


def test_translation_and_text2text_through_the_doors(
    server: tuple[str, str], folders: dict[str, Path]
) -> None:
    url, target = server
    french = generate(url, "t5", "the cat", max_new_tokens=5)
    german = generate(url, "t5", "the cat", max_new_tokens=5, tgt_lang="de")
    prefix = "translate English to German: "
    assert german == {
        "translation_text": direct_seq2seq(folders["t5"], prefix + "the cat", max_new_tokens=5)
    }
    assert set(french) == {"translation_text"} and french != german
    refused = httpx.post(
        f"{url}/models/t5", json={"inputs": ["a"], "parameters": {"tgt_lang": "es"}}
    )
    assert refused.status_code == 400 and "'tgt_lang'" in refused.json()["error"]
    grpc = triton_grpc.InferenceServerClient(target)
    text = triton_grpc.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["the cat"]], dtype=object))
    result = grpc.infer("t5", [text], parameters={"max_new_tokens": 5, "tgt_lang": "de"})
    assert [json.loads(row) for row in result.as_numpy("output").ravel()] == [german]
    grpc.close()
    singles = [generate(url, "bart", p, max_new_tokens=5) for p in PROMPTS]
    batches = sample(
        httpx.get(f"{url}/metrics").text, "batching_batch_size_items_count", model="bart"
    )
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: generate(url, "bart", p, max_new_tokens=5), PROMPTS))
    assert together == singles and set(singles[0]) == {"generated_text"}
    metrics = httpx.get(f"{url}/metrics").text
    assert sample(metrics, "batching_batch_size_items_count", model="bart") - batches < 16


def test_an_input_that_is_not_a_text_is_a_4xx_on_every_door(server: tuple[str, str]) -> None:
    url, target = server
    plain = httpx.post(f"{url}/models/gpt2", json={"inputs": [3], "parameters": {}})
    assert plain.status_code in (400, 422) and "error" in plain.json()
    body = {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    v2 = httpx.post(f"{url}/v2/models/gpt2/infer", json=body)
    assert v2.status_code in (400, 422) and "error" in v2.json()
    grpc = triton_grpc.InferenceServerClient(target)
    number = triton_grpc.InferInput("text", [1, 1], "FP32")
    number.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("gpt2", [number])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    grpc.close()


def test_the_v2_metadata_lists_this_models_parameters(server: tuple[str, str]) -> None:
    url, _ = server
    described = httpx.get(f"{url}/v2/models/gpt2").json()["parameters"]
    assert described["max_new_tokens"]["maximum"] == GPT2_POSITIONS - 1
    assert described["seed"]["batch_neutral"] is True
    assert "src_lang" not in described
    translation = httpx.get(f"{url}/v2/models/t5").json()["parameters"]
    assert translation["tgt_lang"]["choices"] == ["de", "fr"]
    assert "return_full_text" not in translation


def test_both_doors_state_each_models_longest_input(server: tuple[str, str]) -> None:
    url, target = server
    # GPT-2: its positions (prompt and new tokens); BART and T5: their tokenizers' limit.
    limits = {"gpt2": GPT2_POSITIONS, "bart": SEQ2SEQ_MAX_INPUT, "t5": SEQ2SEQ_MAX_INPUT}
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as http:
        for model, limit in limits.items():
            assert http.get_model_metadata(model)["max_seq_length"] == limit
            config = http.get_model_config(model)
            assert config["parameters"]["max_seq_length"] == {"string_value": str(limit)}
    with triton_grpc.InferenceServerClient(target) as grpc:
        for model, limit in limits.items():
            config = grpc.get_model_config(model, as_json=True)["config"]
            assert config["parameters"]["max_seq_length"] == {"string_value": str(limit)}


def test_too_many_stop_strings_is_a_422_that_fails_no_batch_mate(server: tuple[str, str]) -> None:
    url, _ = server
    stop = [f"s{i}" for i in range(17)]

    def post(parameters: dict[str, Any]) -> httpx.Response:
        body = {"inputs": ["the cat"], "parameters": {"max_new_tokens": 4, **parameters}}
        return httpx.post(f"{url}/models/gpt2", json=body, timeout=60)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, [{"stop": stop}] + [{}] * 7))
    assert answers[0].status_code == 422
    assert "'stop' takes at most 16 strings" in answers[0].json()["error"]
    assert [answer.status_code for answer in answers[1:]] == [200] * 7
