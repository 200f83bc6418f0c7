"""The prefix caches' metrics (:mod:`batching.models.generation.prefix_cache`): what a
text-generation model's instances keep of their prompts' prefixes, and what it saved, read
from the model's scheduler at each scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from batching.models.generation.prefix_cache import PrefixLedger, PrefixStats

__all__ = ["PrefixMetrics"]


class PrefixMetrics:
    """The ``batching_prefix_cache_*`` families of one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.bytes = Gauge(
            "batching_prefix_cache_bytes",
            "Memory the model's instances hold of prompt prefixes' keys and values "
            "(text-generation).",
            ["model"],
            registry=r,
        )
        self.capacity = Gauge(
            "batching_prefix_cache_capacity_bytes",
            "The most memory the model's instances may hold of prompt prefixes "
            "(prefix_cache_mb per instance; 0: none kept).",
            ["model"],
            registry=r,
        )
        self.blocks = Gauge(
            "batching_prefix_cache_blocks",
            "Prompt blocks (32 tokens each) the model's instances hold.",
            ["model"],
            registry=r,
        )
        self.hits = Counter(
            "batching_prefix_cache_hits",
            "Prompts that started with a kept prefix and reused it.",
            ["model"],
            registry=r,
        )
        self.misses = Counter(
            "batching_prefix_cache_misses",
            "Prompts longer than a block that found no kept prefix.",
            ["model"],
            registry=r,
        )
        self.reused = Counter(
            "batching_prefix_cache_reused_tokens",
            "Prompt tokens taken from kept prefixes instead of computed.",
            ["model"],
            registry=r,
        )
        self.evictions = Counter(
            "batching_prefix_cache_evictions",
            "Blocks dropped, least recently used first, to stay within the bound.",
            ["model"],
            registry=r,
        )
        #: The counts seen at the last scrape, by model.
        self._seen: dict[str, tuple[PrefixLedger, PrefixStats]] = {}

    def observe(self, model: str, ledger: PrefixLedger) -> None:
        """Set ``model``'s samples from its scheduler's ``ledger`` (nothing for a model whose
        instances keep no prefixes)."""
        if not ledger.kept:
            return
        now = ledger.stats()
        self.bytes.labels(model).set(now.bytes)
        self.capacity.labels(model).set(now.capacity_bytes)
        self.blocks.labels(model).set(now.entries)
        last_ledger, last = self._seen.get(model, (ledger, PrefixStats()))
        if last_ledger is not ledger:
            last = PrefixStats()  # a new deployment of the model: its counts start again
        self._seen[model] = (ledger, now)
        for counter, value, before in (
            (self.hits, now.hits, last.hits),
            (self.misses, now.misses, last.misses),
            (self.reused, now.reused_tokens, last.reused_tokens),
            (self.evictions, now.evictions, last.evictions),
        ):
            child = counter.labels(model)  # shown from the first scrape, 0 or not
            if value > before:
                child.inc(value - before)
