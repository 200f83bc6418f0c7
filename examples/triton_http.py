"""KServe v2 over HTTP with NVIDIA's tritonclient: two texts in, two embeddings out."""

import os
from urllib.parse import urlsplit

import numpy as np
import tritonclient.http as httpclient

url = urlsplit(os.environ.get("SERVER_URL", "http://127.0.0.1:8000"))
client = httpclient.InferenceServerClient(url.netloc)
text = httpclient.InferInput("text", [2, 1], "BYTES")
text.set_data_from_numpy(np.array([["first"], ["second"]], dtype=object))
result = client.infer("all-MiniLM-L6-v2", [text])
print(result.as_numpy("embedding").shape)  # (2, 384)
