"""What the app is given to change its models at run time: the mode, how to read the
repository, how to apply a load call's ``config``, and the instance budget every load must fit.

What the repository holds, and a load call's overrides, are the settings' business: the app
is given :class:`ControlOptions` with callables, so that nothing in :mod:`batching.control`
reads a file.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from batching.model_config import ModelConfig
from batching.runtime.cpus import InstanceBudget, read_cpu_budget
from batching.runtime.deployment import Deployment
from batching.runtime.warmup import InstanceInfo

__all__ = [
    "MODES",
    "ApplyOverrides",
    "ControlOptions",
    "MakeDeployment",
    "OnFailure",
    "OnReady",
    "ReadRepository",
    "RepositoryEntry",
]

#: ``--model-control-mode``: none (the models of the start, for good), explicit (load and
#: unload calls), poll (the repository, re-read every ``--repository-poll-secs``).
MODES = ("none", "explicit", "poll")


@dataclass(frozen=True, slots=True)
class RepositoryEntry:
    """One model the repository holds, as read now."""

    config: ModelConfig
    #: Changes when the model's files change (poll mode reloads the model then).
    stamp: Hashable = None


#: Reads the repository afresh. Raises :class:`~batching.errors.InvalidRequest` with a
#: message that names no path of the machine when it cannot be served.
ReadRepository = Callable[[], Sequence[RepositoryEntry]]

#: A model's configuration with a load call's ``config`` applied, its instances within the
#: budget given (the room the other models leave); raises
#: :class:`~batching.errors.InvalidRequest` naming the key at fault and its bound.
ApplyOverrides = Callable[[ModelConfig, Mapping[str, object], InstanceBudget], ModelConfig]

OnReady = Callable[[Deployment, int, InstanceInfo], None]
OnFailure = Callable[[Deployment, int, str], None]

#: Builds an unstarted deployment of a configuration, which calls the first callable each
#: time an instance is warm and the second when one cannot load.
MakeDeployment = Callable[[ModelConfig, OnReady, OnFailure], Deployment]


def _this_process() -> InstanceBudget:
    return InstanceBudget.of(read_cpu_budget())


@dataclass(frozen=True, slots=True)
class ControlOptions:
    """What the app needs to change its models at run time."""

    mode: str = "none"
    #: Seconds between two reads of the repository in poll mode.
    poll_seconds: float = 15.0
    #: The repository as it is now; None: only the models of the start can be (re)loaded.
    read_repository: ReadRepository | None = None
    #: Applies a load call's ``config``; None: a load call takes no ``config``.
    apply_overrides: ApplyOverrides | None = None
    #: Called once an unloaded or replaced model is stopped and dropped: the host may then
    #: give its memory back (the garbage collector, ``malloc_trim``).
    on_released: Callable[[], None] | None = None
    #: The most model instances served at once (the start-up's bound): a load whose
    #: instances do not fit beside the other models' is refused before anything starts. By
    #: default, this process's CPU budget's.
    instances: InstanceBudget = field(default_factory=_this_process)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"model control mode must be one of {', '.join(MODES)}: {self.mode}")
        if self.poll_seconds <= 0:
            raise ValueError(f"the repository poll interval must be > 0 s: {self.poll_seconds}")
