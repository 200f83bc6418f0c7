"""The models one app serves, by name (:class:`Deployments`): what every door resolves a
request's model in, and what model control changes at run time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from batching.errors import ModelNotFound
from batching.runtime.deployment import Deployment

__all__ = ["Deployments"]


class Deployments:
    """The deployments one app serves, by name; the first is the default.

    The collection changes at run time when models are loaded, reloaded and unloaded
    (:mod:`batching.control`): :meth:`put` and :meth:`remove` swap a name's deployment in one
    step on the event loop, so a request resolves either the old deployment or the new one.
    Resolving takes a lease on it (:mod:`batching.runtime.leases`), which the request gives
    back when it is recorded: a replaced deployment serves its leaseholders before it stops.
    """

    def __init__(self, deployments: Sequence[Deployment]) -> None:
        if not deployments:
            raise ValueError("at least one deployment is needed")
        self.by_name = {deployment.name: deployment for deployment in deployments}
        #: Repository index entries of models not served now: loading beside a served
        #: version, unloading, unloaded or failed (set by :mod:`batching.control`).
        self.others: dict[object, dict[str, str]] = {}

    def __iter__(self) -> Iterator[Deployment]:
        return iter(self.by_name.values())

    @property
    def default(self) -> Deployment:
        """The first model served: the one the routes without a model name use.

        :raises ModelNotFound: every model is unloaded.
        """
        for deployment in self.by_name.values():
            return deployment
        raise ModelNotFound("no model is loaded")

    def get(self, name: str | None, version: str | None = None) -> Deployment:
        """The deployment serving ``name`` (the default when None), at ``version`` if given;
        the running request holds it (a lease) until it is recorded.

        :raises ModelNotFound: no such model, or not that version.
        """
        if name is None:
            deployment = self.default
        else:
            found = self.by_name.get(name)
            if found is None:
                raise ModelNotFound(f"no model named {name!r} is served")
            deployment = found
            if version is not None and version != deployment.config.version:
                raise ModelNotFound(f"model {name!r} has no version {version!r}")
        deployment.leases.take()
        return deployment

    def put(self, deployment: Deployment) -> Deployment | None:
        """Serve ``deployment`` under its name from now on; the one it replaces, if any."""
        replaced = self.by_name.get(deployment.name)
        self.by_name[deployment.name] = deployment
        return replaced

    def remove(self, name: str) -> Deployment | None:
        """Stop resolving ``name``; its deployment, if it was served."""
        return self.by_name.pop(name, None)

    @property
    def ready(self) -> bool:
        """Whether every model is loaded, warm and not draining."""
        return all(deployment.ready for deployment in self.by_name.values())
