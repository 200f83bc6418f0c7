"""Embedding options through the openai SDK: a compact encoding, and options in extra_body."""

import os

from openai import OpenAI

url = os.environ.get("SERVER_URL", "http://127.0.0.1:8000")
client = OpenAI(base_url=f"{url}/v1", api_key="unused")
answer = client.embeddings.create(
    model="all-MiniLM-L6-v2",
    input=["a long document ..."],
    encoding_format="ubinary",  # 48 integers in 0..255 for 384 dimensions
    extra_body={"truncation_direction": "left", "truncate": True},
)
print(answer.data[0].embedding[:4], answer.data[0].model_extra["truncated"], answer.usage)
