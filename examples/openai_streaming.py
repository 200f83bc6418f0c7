"""A streamed completion through the openai SDK, printed as it arrives."""

import os

from openai import OpenAI

url = os.environ.get("SERVER_URL", "http://127.0.0.1:8000")
client = OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("API_KEY", "unused"))
for chunk in client.completions.create(
    model=os.environ.get("MODEL", "my-gpt2"), prompt="Once upon a time", max_tokens=16, stream=True
):
    print(chunk.choices[0].text, end="", flush=True)
print()
