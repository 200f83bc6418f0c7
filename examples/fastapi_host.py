"""The batching app mounted in a FastAPI application: uvicorn examples.fastapi_host:app"""

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from batching import BatchingConfig, ModelConfig, create_app

# Without this, batching's log lines (loading, warm-up, ready, errors) go nowhere.
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

inference = create_app(ModelConfig(name="minilm", batching=BatchingConfig(max_batch_size=32)))


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with inference.router.lifespan_context(inference):
        yield


app = FastAPI(lifespan=lifespan)
app.mount("/ml", inference)  # POST /ml/models/minilm, /ml/v2/models/minilm/infer, ...
