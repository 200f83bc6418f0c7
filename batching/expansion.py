"""Request items that are several units of batching: a model's ``expand`` and ``join`` hooks,
applied by the data plane for every door.

A model whose metadata says ``"expands": True`` (zero-shot classification: one item is a text
and its candidate labels) turns each item into units (one per text and label pair) with its
``expand`` hook. The units are what is counted, queued, packed under the item and token caps
and run, like any other items; the answer to each item is its ``join`` of its units' outputs.
The core never learns of it: it sees units only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batching.errors import InvalidRequest, PayloadTooLarge
from batching.models.items import Item
from batching.models.protocol import EXPANDS_KEY
from batching.runtime.deployment import Deployment

__all__ = ["Expansion", "expand_items"]


@dataclass(frozen=True, slots=True)
class Expansion:
    """A request's items, each as its units, and how to answer them from the units' outputs."""

    items: Sequence[Item]
    units: list[Item]
    #: How many units each item has, in order.
    sizes: list[int]
    join: Callable[[Item, list[object]], object]

    def answers(self, outputs: Sequence[object]) -> list[object]:
        """One answer per item from the outputs of :attr:`units`, in order."""
        answers: list[object] = []
        start = 0
        for item, size in zip(self.items, self.sizes, strict=True):
            answers.append(self.join(item, list(outputs[start : start + size])))
            start += size
        return answers


async def expand_items(deployment: Deployment, items: Sequence[Item]) -> Expansion | None:
    """``items`` as units of batching, or None when the model serves items as they are.

    :raises InvalidRequest: the model cannot expand an item (its ``ValueError`` says why).
    :raises PayloadTooLarge: the units outnumber what one request may carry.
    """
    if not deployment.metadata.get(EXPANDS_KEY):
        return None
    hooks = await deployment.counting_hooks()
    expand, join = hooks.expand, hooks.join
    if expand is None or join is None:
        return None

    def expanded() -> tuple[list[Item], list[int]] | InvalidRequest:
        assert expand is not None
        units: list[Item] = []
        sizes: list[int] = []
        for item in items:
            try:
                parts = expand(item)
            except ValueError as exc:
                return InvalidRequest(str(exc))
            units.extend(parts)
            sizes.append(len(parts))
        return units, sizes

    # On a worker thread: a request may make thousands of units, and a model may tokenize to
    # check that they fit; the event loop serves other requests meanwhile.
    done = await asyncio.to_thread(expanded)
    if isinstance(done, InvalidRequest):
        raise done
    units, sizes = done
    cap = deployment.config.batching.max_items_per_request
    if len(units) > cap:
        raise PayloadTooLarge(
            f"this request's {len(items)} item(s) make {len(units)} units of batching for "
            f"model {deployment.name!r} (zero-shot: one per text and label); a request may "
            f"carry at most {cap} (--max-items-per-request)"
        )
    return Expansion(items, units, sizes, join)
