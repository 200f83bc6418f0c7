"""One text, every door, the real default model: the same float32 vector through the plain
route, KServe v2 over HTTP (JSON and binary tensors), KServe v2 over gRPC, and the OpenAI
embeddings API (base64 and float), each asked with its own real client."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from batching import create_app
from tests.support.servers import free_port
from tests.support.threaded import serving_in_thread

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["The cat sits on the mat.", "ünïcødé and emoji 🙂 in one sentence"]


def test_every_door_gives_the_same_vector_for_the_same_text() -> None:
    grpc_port = free_port()
    with serving_in_thread(create_app(grpc_port=grpc_port), timeout=120) as url:
        host = url.removeprefix("http://")
        for text in TEXTS:  # one request at a time: each is a batch of one, whatever the door
            answers: dict[str, np.ndarray] = {}
            plain = httpx.post(f"{url}/", json={"inputs": [text]}, timeout=30)
            assert plain.status_code == 200, plain.text
            answers["plain"] = np.asarray(plain.json()["outputs"][0], dtype=np.float32)

            with triton_http.InferenceServerClient(host) as client:
                for binary in (False, True):
                    tensor = triton_http.InferInput("text", [1, 1], "BYTES")
                    tensor.set_data_from_numpy(np.array([[text]], dtype=object), binary)
                    wanted = triton_http.InferRequestedOutput("embedding", binary_data=binary)
                    result = client.infer(MODEL, [tensor], outputs=[wanted])
                    answers[f"v2 http {'binary' if binary else 'json'}"] = result.as_numpy(
                        "embedding"
                    )[0]

            with triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
                tensor = triton_grpc.InferInput("text", [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[text]], dtype=object))
                answers["v2 grpc"] = client.infer(MODEL, [tensor]).as_numpy("embedding")[0]

            sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            base64 = sdk.embeddings.create(model=MODEL, input=text)  # the SDK asks for base64
            floats = sdk.embeddings.create(model=MODEL, input=[text], encoding_format="float")
            answers["openai base64"] = np.asarray(base64.data[0].embedding, dtype=np.float32)
            answers["openai float"] = np.asarray(floats.data[0].embedding, dtype=np.float32)

            reference = answers["plain"]
            assert reference.shape == (384,)
            assert abs(float(np.linalg.norm(reference)) - 1.0) < 1e-5
            for door, vector in answers.items():
                assert vector.dtype == np.float32, door
                assert vector.tobytes() == reference.tobytes(), door
