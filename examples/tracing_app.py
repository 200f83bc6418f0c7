"""An app that traces every request to an OTLP collector: uvicorn examples.tracing_app:app"""

import os

from batching import create_app
from batching.tracing.tracing_config import tracing_config

endpoint = os.environ.get("OTLP_ENDPOINT", "http://127.0.0.1:4318")
# --otlp-endpoint, --otlp-protocol, --trace-rate, and the OTEL_* variables to read
app = create_app(tracing=tracing_config(endpoint, None, "0.5", os.environ))
