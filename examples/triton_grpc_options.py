"""Embedding options as KServe v2 request parameters, over gRPC."""

import os

import numpy as np
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient(os.environ.get("GRPC_URL", "127.0.0.1:8001"))
text = grpcclient.InferInput("text", [1, 1], "BYTES")
text.set_data_from_numpy(np.array([["first sentence"]], dtype=object))
result = client.infer(
    "all-MiniLM-L6-v2", [text], parameters={"encoding": "uint8", "truncate": False}
)
tokens = result.get_response().parameters["prompt_tokens"].int64_param
print(result.as_numpy("embedding").dtype, tokens)  # uint8 4
