"""Embeddings through the official openai SDK."""

import os

from openai import OpenAI

url = os.environ.get("SERVER_URL", "http://127.0.0.1:8000")
client = OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("API_KEY", "unused"))
vectors = client.embeddings.create(model="all-MiniLM-L6-v2", input=["first", "second"])
print(len(vectors.data), len(vectors.data[0].embedding))  # 2 384
