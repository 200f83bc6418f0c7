"""Every client with an API key: the openai SDK, and tritonclient over HTTP and gRPC."""

import os
from urllib.parse import urlsplit

import numpy as np
import openai
import tritonclient.grpc
import tritonclient.http

url = os.environ.get("SERVER_URL", "http://127.0.0.1:8000")
key = os.environ.get("API_KEY", "sk-first")

client = openai.OpenAI(base_url=f"{url}/v1", api_key=key)
print(len(client.embeddings.create(model="all-MiniLM-L6-v2", input="hi").data))

text = tritonclient.http.InferInput("text", [1, 1], "BYTES")
text.set_data_from_numpy(np.array([["hi"]], dtype=object))
http = tritonclient.http.InferenceServerClient(urlsplit(url).netloc)
result = http.infer("all-MiniLM-L6-v2", [text], headers={"authorization": f"Bearer {key}"})
print(result.as_numpy("embedding").shape)

text = tritonclient.grpc.InferInput("text", [1, 1], "BYTES")
text.set_data_from_numpy(np.array([["hi"]], dtype=object))
grpc = tritonclient.grpc.InferenceServerClient(os.environ.get("GRPC_URL", "127.0.0.1:8001"))
result = grpc.infer("all-MiniLM-L6-v2", [text], headers={"authorization": f"Bearer {key}"})
print(result.as_numpy("embedding").shape)
