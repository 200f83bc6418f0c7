"""Text models whose tokenizer and model disagree on the longest input: each is served with
its texts cut to the smallest real limit (the tokenizer's ``model_max_length`` unless it names
none, the model's positions, sentence-transformers' ``max_seq_length``), and
``GET /v2/models/{name}`` and its configuration state that limit as ``max_seq_length``.

The folders are built with transformers' (and sentence-transformers') own ``save_pretrained``
and served in-process: a BART whose tokenizer allows 512 tokens over 32 positions (which failed
its warm-up with ``IndexError``), GPT-2s whose tokenizer allows more than ``n_positions`` or
names no limit, BERT classifiers and embedders, a RoBERTa whose position ids start after the
padding index, and sentence-transformers folders whose ``max_seq_length`` is the smallest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import torch
import transformers

from batching import ModelConfig, create_app
from batching.models.shared.text_models import DEFAULT_MAX_LENGTH, max_length_of, position_limit
from tests.support.asgi import serving
from tests.support.generators import GPT2_POSITIONS, bart_folder, gpt2_folder
from tests.support.tiny import (
    POSITIONS,
    classifier_folder,
    encoder_folder,
    roberta_classifier_folder,
    saved_sentence_folder,
    sentence_folder,
)

#: The BARTs' positions: fewer than their tokenizer allows.
BART_POSITIONS = 32
#: Far more tokens than any limit here.
LONG = " ".join(["the cat sat on the mat and it was very good"] * 30)
NEW = 6


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("limits")
    return {
        "bart": bart_folder(root, "bart", model_max_length=512, positions=BART_POSITIONS),
        "bart-open": bart_folder(root, "bart-open", model_max_length=None, positions=32),
        "gpt2": gpt2_folder(root, "gpt2", model_max_length=1024),
        "gpt2-open": gpt2_folder(root, "gpt2-open", model_max_length=None),
        "bert": classifier_folder(root, "bert", ["no", "yes"], model_max_length=512),
        "bert-open": encoder_folder(root, "bert-open"),
        "roberta": roberta_classifier_folder(root, "roberta", ["no", "yes"]),
        "st": sentence_folder(root, "st", max_seq_length=12, model_max_length=512),
        "st-over": sentence_folder(root, "st-over", max_seq_length=512, model_max_length=512),
        "st-saved": saved_sentence_folder(root, "st-saved", max_seq_length=10),
    }


#: Each served model: its folder, task (None: a sentence-transformers folder) and its limit.
MODELS: dict[str, tuple[str, str | None, int]] = {
    "bart-sum": ("bart", "summarization", BART_POSITIONS),
    "bart-t2t": ("bart", "text2text-generation", BART_POSITIONS),
    "bart-open": ("bart-open", "summarization", BART_POSITIONS),
    "gpt2": ("gpt2", "text-generation", GPT2_POSITIONS),
    "gpt2-open": ("gpt2-open", "text-generation", GPT2_POSITIONS),
    "bert": ("bert", "text-classification", POSITIONS),
    "bert-open": ("bert-open", "feature-extraction", POSITIONS),
    "roberta": ("roberta", "text-classification", POSITIONS),
    "st": ("st", None, 12),
    "st-over": ("st-over", None, POSITIONS),
    "st-saved": ("st-saved", None, 10),
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def client(folders: dict[str, Path]) -> AsyncIterator[httpx.AsyncClient]:
    configs = [
        ModelConfig(name=name, source=str(folders[folder]), task=task)
        for name, (folder, task, _) in MODELS.items()
    ]
    # Every model warms up with a text longer than its limit: one that could not take it
    # would never report ready.
    ready, failed = asyncio.Event(), asyncio.Event()
    app = create_app(configs, on_all_ready=ready.set, on_load_failure=lambda *_: failed.set())
    async with serving(app, wait_ready=False) as client:
        either = [asyncio.ensure_future(event.wait()) for event in (ready, failed)]
        await asyncio.wait(either, timeout=300, return_when=asyncio.FIRST_COMPLETED)
        for waiting in either:
            waiting.cancel()
        assert ready.is_set() and not failed.is_set()
        yield client


def _seq2seq_reference(folder: Path, text: str, limit: int) -> str:
    """The greedy answer of the model to ``text`` cut at ``limit`` tokens: run at the limit."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    encoded = tokenizer([text], return_tensors="pt", truncation=True, max_length=limit)
    assert encoded["input_ids"].shape[1] == limit
    with torch.inference_mode():
        out = model.generate(**encoded, do_sample=False, max_new_tokens=NEW)
    return str(tokenizer.decode(out[0], skip_special_tokens=True))


def _causal_reference(folder: Path, text: str) -> str:
    """GPT-2's greedy continuation of the end of ``text`` that leaves room for ``NEW`` tokens
    in its positions: prompt and new tokens together fill them."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    ids = tokenizer(text)["input_ids"][-(GPT2_POSITIONS - NEW) :]
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            pad_token_id=tokenizer.eos_token_id,
        )
    assert out.shape[1] == GPT2_POSITIONS
    before = tokenizer.decode(ids, skip_special_tokens=True)
    return str(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))[len(before) :]


def _streamed(body: bytes) -> str:
    events = [line[len(b"data: ") :] for line in body.splitlines() if line.startswith(b"data: ")]
    pieces = [orjson.loads(event) for event in events if event != b"[DONE]"]
    assert all("error" not in piece for piece in pieces), pieces
    return "".join(piece["text_output"] for piece in pieces)


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(MODELS))
async def test_metadata_and_config_state_the_smallest_limit(
    client: httpx.AsyncClient, name: str
) -> None:
    limit = MODELS[name][2]
    described = (await client.get(f"/v2/models/{name}")).json()
    assert described["max_seq_length"] == limit
    config = (await client.get(f"/v2/models/{name}/config")).json()
    assert config["parameters"]["max_seq_length"] == {"string_value": str(limit)}
    if MODELS[name][1] is None:
        assert described["embedding"]["max_seq_length"] == limit


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "folder", "key"),
    [
        ("bart-sum", "bart", "summary_text"),
        ("bart-t2t", "bart", "generated_text"),
        ("bart-open", "bart-open", "summary_text"),
    ],
)
async def test_bart_cuts_a_long_text_to_its_positions_not_its_tokenizers_limit(
    client: httpx.AsyncClient, folders: dict[str, Path], name: str, folder: str, key: str
) -> None:
    body = {"inputs": [LONG], "parameters": {"max_new_tokens": NEW}}
    answer = await client.post(f"/models/{name}", json=body)
    assert answer.status_code == 200, answer.text
    want = _seq2seq_reference(folders[folder], LONG, BART_POSITIONS)
    assert answer.json()["outputs"] == [{key: want}]
    stream = await client.post(
        f"/v2/models/{name}/generate_stream",
        json={"text_input": LONG, "parameters": {"max_new_tokens": NEW}},
    )
    assert stream.status_code == 200, stream.text
    assert _streamed(stream.content) == want
    refused = await client.post(
        f"/models/{name}", json={"inputs": [LONG], "parameters": {"truncate": False}}
    )
    assert refused.status_code == 413
    assert f"this model takes at most {BART_POSITIONS}" in refused.json()["error"]


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["gpt2", "gpt2-open"])
async def test_gpt2_keeps_prompt_and_new_tokens_within_its_positions(
    client: httpx.AsyncClient, folders: dict[str, Path], name: str
) -> None:
    want = _causal_reference(folders[name], LONG)
    parameters = {"max_new_tokens": NEW, "return_full_text": False}
    answer = await client.post(f"/models/{name}", json={"inputs": [LONG], "parameters": parameters})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [{"generated_text": want}]
    stream = await client.post(
        f"/v2/models/{name}/generate_stream",
        json={"text_input": LONG, "parameters": {"max_new_tokens": NEW}},
    )
    assert stream.status_code == 200, stream.text
    assert _streamed(stream.content) == want
    refused = await client.post(
        f"/models/{name}",
        json={"inputs": [LONG], "parameters": {"max_new_tokens": NEW, "truncate": False}},
    )
    assert refused.status_code == 413
    assert (
        f"at most {GPT2_POSITIONS - NEW}: its {GPT2_POSITIONS} positions less max_new_tokens "
        f"{NEW}" in refused.json()["error"]
    )


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["bert", "roberta"])
async def test_a_classifier_reads_a_long_text_cut_at_its_positions(
    client: httpx.AsyncClient, folders: dict[str, Path], name: str
) -> None:
    pipe = transformers.pipeline("text-classification", model=str(folders[name]))
    want = pipe(LONG, truncation=True, max_length=POSITIONS)
    answer = await client.post(f"/models/{name}", json={"inputs": [LONG]})
    assert answer.status_code == 200, answer.text
    (got,) = answer.json()["outputs"]
    assert got["label"] == want[0]["label"]
    assert got["score"] == pytest.approx(want[0]["score"], abs=1e-4)


@pytest.mark.anyio
async def test_feature_extraction_without_a_tokenizer_limit_reads_the_models_positions(
    client: httpx.AsyncClient, folders: dict[str, Path]
) -> None:
    folder = folders["bert-open"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    encoded = tokenizer([LONG], return_tensors="pt", truncation=True, max_length=POSITIONS)
    assert encoded["input_ids"].shape[1] == POSITIONS
    with torch.inference_mode():
        want = model(**encoded).last_hidden_state.mean(dim=1)[0].numpy()
    answer = await client.post("/models/bert-open", json={"inputs": [LONG]})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["outputs"][0], want, atol=1e-4)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["st", "st-over", "st-saved"])
async def test_a_sentence_embedder_states_the_cut_at_its_smallest_limit(
    client: httpx.AsyncClient, name: str
) -> None:
    limit = MODELS[name][2]
    answer = await client.post(f"/models/{name}", json={"inputs": [LONG, "the cat"]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["truncated"] == [True, False]
    assert body["usage"]["prompt_tokens"] == limit + 4  # [CLS] the cat [SEP]
    refused = await client.post(f"/models/{name}", json={"inputs": [LONG], "truncate": False})
    assert refused.status_code == 413
    assert f"over the model's limit of {limit}" in refused.json()["error"]


def test_the_limit_is_the_smallest_real_one_of_tokenizer_positions_and_declared() -> None:
    class Tokenizer:
        def __init__(self, limit: int) -> None:
            self.model_max_length = limit

    sentinel = Tokenizer(int(1e30))  # what transformers reports when a tokenizer names none
    roberta = transformers.RobertaConfig(max_position_embeddings=514)  # roberta-base's, pad 1
    assert position_limit(roberta) == 512
    assert position_limit(roberta.to_dict()) == 512
    assert position_limit(transformers.BartConfig(max_position_embeddings=1024)) == 1024
    assert position_limit(transformers.GPT2Config(n_positions=64)) == 64
    assert position_limit(transformers.T5Config()) is None
    assert max_length_of(sentinel, roberta) == 512
    assert max_length_of(Tokenizer(128), roberta) == 128
    assert max_length_of(Tokenizer(512), {"max_position_embeddings": 128}) == 128
    assert max_length_of(sentinel, {"max_position_embeddings": 128}, declared=256) == 128
    assert max_length_of(Tokenizer(512), {"max_position_embeddings": 128}, declared=16) == 16
    assert max_length_of(sentinel, transformers.T5Config()) == DEFAULT_MAX_LENGTH
    assert max_length_of(None, {}, default=7) == 7


def test_a_roberta_table_takes_its_stated_tokens_and_not_one_more() -> None:
    config = transformers.RobertaConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
        max_position_embeddings=34,
        pad_token_id=1,
    )
    model = transformers.RobertaModel(config).eval()
    limit = position_limit(config)
    assert limit == 32
    with torch.inference_mode():
        model(input_ids=torch.full((1, limit), 5))
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.full((1, limit + 1), 5))
