"""Triton's model repository and logging extensions over gRPC: ``RepositoryModelLoad``,
``RepositoryModelUnload`` and ``LogSettings`` of ``inference.GRPCInferenceService``, beside
the RPCs of :mod:`.v2` (the repository index is there). They mean what the HTTP routes mean
(:mod:`batching.http.repository`, :mod:`batching.http.logging_ext`), with the same errors as
gRPC status codes, and need an API key when keys are configured (:mod:`.auth`). Loading and
unloading also need an admin key (``PERMISSION_DENIED`` without one), as on HTTP."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2

from batching.control import ModelControl
from batching.errors import InvalidRequest
from batching.kserve.repository import check_unload_parameters, load_overrides
from batching.log_settings import LogSettings
from batching.plane import DataPlane

from .auth import presented_key
from .tensors import choice_value, parameters_of
from .v2 import InferenceServicer, _answers_errors

__all__ = ["ControlServicer"]


def _repository_parameters(request: Any) -> dict[str, object]:
    """The call's parameters as plain values; only the default repository ("")."""
    if request.repository_name:
        raise InvalidRequest(
            f'repository_name: this server has one model repository; send "", not '
            f"{request.repository_name!r}"
        )
    return parameters_of(request.parameters)


class ControlServicer(InferenceServicer):
    """The servicer of :mod:`.v2`, with model control and the log settings."""

    def __init__(
        self,
        plane: DataPlane,
        control: ModelControl | None,
        log_settings: LogSettings | None,
    ) -> None:
        super().__init__(plane)
        self.control = control
        self.log_settings = log_settings

    @_answers_errors
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        control = self._control()
        control.authorize(presented_key(context.invocation_metadata()))
        overrides = load_overrides(_repository_parameters(request))
        await control.load(request.model_name, overrides)
        return service_pb2.RepositoryModelLoadResponse()

    @_answers_errors
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        control = self._control()
        control.authorize(presented_key(context.invocation_metadata()))
        check_unload_parameters(_repository_parameters(request))
        await control.unload(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    @_answers_errors
    async def LogSettings(self, request: Any, context: Any) -> Any:
        settings = self.log_settings
        if settings is None:
            raise InvalidRequest("this server's log settings cannot be changed at run time")
        given = {key: choice_value(value) for key, value in request.settings.items()}
        # gRPC's settings are typed: uint32 for the verbose level, strings for the rest.
        now = settings.update(given) if given else settings.current()
        response = service_pb2.LogSettingsResponse()
        for key, value in now.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = str(value)
        return response

    def _control(self) -> ModelControl:
        if self.control is None:
            raise InvalidRequest("this server's models cannot be loaded or unloaded at run time")
        return self.control
