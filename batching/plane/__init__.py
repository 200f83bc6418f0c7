"""The data plane: the one request path every door calls (:class:`DataPlane`), in modules of
one noun each: a request as it runs (:mod:`.calls`), the models served (:mod:`.deployments`),
token counting (:mod:`.counting`), the batcher's queue (:mod:`.queueing`), embedding plans
(:mod:`.embedding`) and generation (:mod:`.generation`). It knows no HTTP."""

from __future__ import annotations

from .calls import Call, Caller, Deadline
from .counting import TokenCounts
from .dataplane import DataPlane, Inferred
from .deployments import Deployments
from .embedding import TokenLimits
from .generation import Generation

__all__ = [
    "Call",
    "Caller",
    "DataPlane",
    "Deadline",
    "Deployments",
    "Generation",
    "Inferred",
    "TokenCounts",
    "TokenLimits",
]
