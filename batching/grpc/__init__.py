"""The gRPC door: KServe v2 over gRPC (``inference.GRPCInferenceService``, Triton's service),
served by the same process into the same queues as HTTP. The stubs are those generated in
``tritonclient.grpc``; what the protocol means is :mod:`batching.kserve`'s; the one place
errors become gRPC status codes is :mod:`.errors`. :class:`GrpcServer` is what the app starts
and drains."""

from .limits import GrpcLimits
from .server import GrpcServer, GrpcUnavailable

__all__ = ["GrpcLimits", "GrpcServer", "GrpcUnavailable"]
