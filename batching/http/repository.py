"""Triton's model repository extension over HTTP: ``POST
/v2/repository/models/{model_name}/load`` and ``.../unload`` (the index is in :mod:`.v2`).

Both change the server: they answer 400 naming the mode unless ``--model-control-mode
explicit``, and 403 unless the request presents an admin key (or the server has no keys at
all: :meth:`batching.control.ModelControl.authorize`), before the body is read. With API
keys, :mod:`.auth` has already refused (401) a request with no valid key. A load answers once
the model serves (200, empty, as Triton), or with the error, the old version still serving;
a load that does not fit the server's bounds is 400 before anything starts. An unload answers
once its accepted requests are served and it is stopped.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from batching.control import ModelControl
from batching.kserve.repository import check_unload_parameters, load_overrides, parameters_of

from .auth import presented_key
from .requests import read_body

__all__ = ["repository_routes"]

#: A load or unload body holds a few parameters at most.
MAX_BODY_BYTES = 1 << 16


def repository_routes(control: ModelControl) -> list[Route]:
    """The load and unload routes over ``control``."""

    async def load(request: Request) -> Response:
        control.authorize(presented_key(request.scope))
        name = request.path_params["model_name"]
        parameters = parameters_of(await read_body(request, MAX_BODY_BYTES))
        await control.load(name, load_overrides(parameters))
        return Response(status_code=200)

    async def unload(request: Request) -> Response:
        control.authorize(presented_key(request.scope))
        name = request.path_params["model_name"]
        check_unload_parameters(parameters_of(await read_body(request, MAX_BODY_BYTES)))
        await control.unload(name)
        return Response(status_code=200)

    prefix = "/v2/repository/models/{model_name}"
    return [
        Route(f"{prefix}/load", load, methods=["POST"]),
        Route(f"{prefix}/unload", unload, methods=["POST"]),
    ]
