"""KServe v2 over gRPC with tritonclient, with a 5 s deadline."""

import os

import numpy as np
import tritonclient.grpc as grpcclient

client = grpcclient.InferenceServerClient(os.environ.get("GRPC_URL", "127.0.0.1:8001"))
text = grpcclient.InferInput("text", [2, 1], "BYTES")
text.set_data_from_numpy(np.array([["first"], ["second"]], dtype=object))
result = client.infer("all-MiniLM-L6-v2", [text], client_timeout=5.0)  # 5 s deadline
print(result.as_numpy("embedding").shape)  # (2, 384)
