"""Roll a model forward (or back) in explicit mode: load it again after changing its config."""

import os
from urllib.parse import urlsplit

import tritonclient.http as httpclient

url = urlsplit(os.environ.get("SERVER_URL", "http://127.0.0.1:8000"))
model = os.environ.get("MODEL", "sentiment")
# When the server has keys: an admin key.
key = {"authorization": f"Bearer {os.environ.get('ADMIN_KEY', 'ADMIN_KEY')}"}
client = httpclient.InferenceServerClient(url.netloc)
client.load_model(model, headers=key)  # returns once the new version serves; raises if it failed
print(client.get_model_metadata(model, headers=key)["versions"])  # ['2']
