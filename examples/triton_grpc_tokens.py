"""Per-token vectors over gRPC: ask for the outputs by name, split the rows with the counts."""

import os

import numpy as np
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient(os.environ.get("GRPC_URL", "127.0.0.1:8001"))
text = grpcclient.InferInput("text", [2, 1], "BYTES")
text.set_data_from_numpy(np.array([["Hello world"], ["a dog"]], dtype=object))
wanted = [grpcclient.InferRequestedOutput(name) for name in ("token_embeddings", "token_counts")]
result = client.infer(
    "all-MiniLM-L6-v2", [text], outputs=wanted, parameters={"truncation_direction": "left"}
)
vectors, counts = result.as_numpy("token_embeddings"), result.as_numpy("token_counts")
per_text = np.split(vectors, np.cumsum(counts)[:-1])
print(vectors.shape, [v.shape for v in per_text])  # (8, 384) [(4, 384), (4, 384)]
