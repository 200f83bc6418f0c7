"""The prompt prefixes a causal LM instance keeps: what its prompts' first tokens computed
(their keys and values), so that a later prompt starting with the same tokens (a system
prompt, a few-shot preamble) reuses them instead of computing them again. Pure bookkeeping:
what a block holds is the caller's (:mod:`.prefix_prefill` stores tensors); no torch here.

- **Blocks**: a prompt is cut into blocks of :data:`BLOCK_TOKENS` tokens; only whole blocks
  are kept. A block's key is a digest of its tokens chained over the blocks before it (as
  vLLM's automatic prefix caching keys its blocks), so equal keys mean equal prompts up to
  that block's end, and a prompt's cached prefix is the longest run of its blocks found, from
  the first. A block also keeps its tokens and its parent's key, checked on every find.
- **Reuse**: a prompt reuses at most its whole blocks shorter than itself: at least one of
  its tokens runs, for the logits of its first new token.
- **Bound**: the blocks' bytes never exceed the capacity (``--prefix-cache-mb``; 0 keeps
  nothing and finds nothing). The least recently used blocks go first; a block is always used
  more recently than the blocks after it in its prompts (a find or a store touches a chain
  from its end to its start), so eviction takes prompts' ends first and never strands a block
  whose prefix has gone.
- **One instance's**: each instance's model keeps its own (its thread alone finds and stores);
  the statistics (:class:`PrefixStats`) are read from the event loop, as plain numbers.
"""

from __future__ import annotations

import array
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_PREFIX_CACHE_MB",
    "MAX_PREFIX_CACHE_MB",
    "PrefixCache",
    "PrefixLedger",
    "PrefixStats",
]

#: Tokens per block: the unit a prefix is kept and found in.
BLOCK_TOKENS = 32
#: The bytes an instance's prefix cache may hold, in MiB, when the settings do not say.
DEFAULT_PREFIX_CACHE_MB = 256
#: The largest ``prefix_cache_mb`` (1 TiB: far above any machine this serves on).
MAX_PREFIX_CACHE_MB = 1 << 20

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """What a prefix cache holds and has done (several caches' add up)."""

    #: The most bytes it may hold.
    capacity_bytes: int = 0
    #: The bytes its blocks hold now.
    bytes: int = 0
    #: Its blocks now.
    entries: int = 0
    #: Prompts long enough to have a cached prefix that found one...
    hits: int = 0
    #: ... and that found none.
    misses: int = 0
    #: Prompt tokens not computed: taken from the cache.
    reused_tokens: int = 0
    #: Blocks dropped to stay within the capacity.
    evictions: int = 0

    def __add__(self, other: PrefixStats) -> PrefixStats:
        return PrefixStats(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(PrefixStats))
        )

    def counts(self) -> PrefixStats:
        """The counters alone (what outlives the cache: hits, misses, tokens, evictions)."""
        return PrefixStats(
            hits=self.hits,
            misses=self.misses,
            reused_tokens=self.reused_tokens,
            evictions=self.evictions,
        )


@dataclass(slots=True, eq=False)
class _Block(Generic[T]):
    parent: bytes
    tokens: tuple[int, ...]
    value: T
    size: int


class PrefixCache(Generic[T]):
    """An LRU of prompt blocks, bounded by bytes.

    :param capacity_bytes: the most bytes the blocks may hold (0: keep nothing).
    :param size_of: the bytes one block's value holds.
    :param block: tokens per block.
    """

    def __init__(
        self, capacity_bytes: int, size_of: Callable[[T], int], block: int = BLOCK_TOKENS
    ) -> None:
        if capacity_bytes < 0 or block < 1:
            raise ValueError("a prefix cache needs a capacity >= 0 and blocks of >= 1 token")
        self.capacity = capacity_bytes
        self.block = block
        self._size_of = size_of
        self._blocks: OrderedDict[bytes, _Block[T]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._reused = self._evictions = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def stats(self) -> PrefixStats:
        return PrefixStats(
            self.capacity,
            self._bytes,
            len(self._blocks),
            self._hits,
            self._misses,
            self._reused,
            self._evictions,
        )

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    # -- keys -------------------------------------------------------------------------------

    def keys(self, ids: Sequence[int], blocks: int | None = None) -> list[bytes]:
        """The chained keys of the first ``blocks`` whole blocks of ``ids`` (all by default)."""
        whole = len(ids) // self.block
        count = whole if blocks is None else min(blocks, whole)
        keys, parent = [], b""
        for index in range(count):
            parent = _key(parent, ids[index * self.block : (index + 1) * self.block])
            keys.append(parent)
        return keys

    def usable(self, ids: Sequence[int]) -> int:
        """The most whole blocks a prompt of ``ids`` may reuse: at least one token runs."""
        return (len(ids) - 1) // self.block if self.enabled else 0

    # -- find -------------------------------------------------------------------------------

    def find(self, ids: Sequence[int], *, count: bool = True) -> list[T]:
        """The values of the longest run of ``ids``'s blocks held, from its first, shorter
        than ``ids``; touched (and, with ``count``, counted as a hit or a miss)."""
        usable = self.usable(ids)
        if usable < 1:
            return []
        found: list[bytes] = []
        parent = b""
        for index, key in enumerate(self.keys(ids, usable)):
            block = self._blocks.get(key)
            tokens = tuple(ids[index * self.block : (index + 1) * self.block])
            if block is None or block.parent != parent or block.tokens != tokens:
                break
            found.append(key)
            parent = key
        self._touch(found)
        if count:
            if found:
                self._hits += 1
                self._reused += len(found) * self.block
            else:
                self._misses += 1
        return [self._blocks[key].value for key in found]

    def held(self, ids: Sequence[int]) -> int:
        """How many of ``ids``'s usable blocks :meth:`find` would find (nothing touched)."""
        held = 0
        for key in self.keys(ids, self.usable(ids)):
            if key not in self._blocks:
                break
            held += 1
        return held

    def shared(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Prefixes that two or more of ``prompts`` could reuse and the cache lacks: each
        prompt's longest such one, but none that another of them starts with (computing the
        longer one keeps it too)."""
        if not self.enabled or len(prompts) < 2:
            return []
        chains = [self.keys(ids, self.usable(ids)) for ids in prompts]
        seen: dict[bytes, int] = {}
        for chain in chains:
            for key in chain:
                seen[key] = seen.get(key, 0) + 1
        deepest: dict[bytes, list[int]] = {}
        for ids, chain in zip(prompts, chains, strict=True):
            for depth in range(len(chain), 0, -1):
                key = chain[depth - 1]
                if seen[key] > 1 and key not in self._blocks:
                    deepest[key] = list(ids[: depth * self.block])
                    break
        inner = {key for ids in deepest.values() for key in self.keys(ids)[:-1]}
        return [ids for key, ids in deepest.items() if key not in inner]

    # -- store ------------------------------------------------------------------------------

    def store(self, ids: Sequence[int], make: Callable[[int], T]) -> None:
        """Keep ``ids``'s whole blocks: ``make(index)`` gives the value of block ``index``,
        asked only for blocks not held yet. Then the least recently used blocks go until
        the bytes are within the capacity."""
        if not self.enabled:
            return
        chain = self.keys(ids)
        parent = b""
        for index, key in enumerate(chain):
            if key not in self._blocks:
                value = make(index)
                tokens = tuple(ids[index * self.block : (index + 1) * self.block])
                block = _Block(parent, tokens, value, self._size_of(value))
                if block.size > self.capacity:
                    chain = chain[:index]
                    break
                self._blocks[key] = block
                self._bytes += block.size
            parent = key
        self._touch(chain)
        while self._bytes > self.capacity and self._blocks:
            _, gone = self._blocks.popitem(last=False)
            self._bytes -= gone.size
            self._evictions += 1

    def clear(self) -> None:
        self._blocks.clear()
        self._bytes = 0

    def _touch(self, chain: Sequence[bytes]) -> None:
        # From the end to the start: a block is always more recent than the ones after it.
        for key in reversed(chain):
            self._blocks.move_to_end(key)


def _key(parent: bytes, tokens: Sequence[int]) -> bytes:
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array.array("q", tokens).tobytes())
    return digest.digest()


@runtime_checkable
class KeepsPrefixes(Protocol):
    """A running batch that may keep its prompts' prefixes (a causal LM's)."""

    prefixes: PrefixCache[Any] | None


class PrefixLedger:
    """One model's prefix caches across its instances, for its metrics: the live instances'
    caches, and the counts of the ones that have stopped (so the counters never go back)."""

    def __init__(self) -> None:
        self._live: list[PrefixCache[Any]] = []
        self._retired = PrefixStats()
        #: Whether an instance of the model has had a cache (even a disabled one).
        self.kept = False

    def track(self, batch: object) -> None:
        """Count ``batch``'s cache (an instance's running batch), if it keeps one."""
        if isinstance(batch, KeepsPrefixes) and batch.prefixes is not None:
            self._live.append(batch.prefixes)
            self.kept = True

    def retire(self, batch: object) -> None:
        """``batch``'s instance stopped: its cache's counts stay, its bytes go."""
        if isinstance(batch, KeepsPrefixes) and batch.prefixes in self._live:
            assert batch.prefixes is not None
            self._live.remove(batch.prefixes)
            self._retired += batch.prefixes.stats().counts()

    def stats(self) -> PrefixStats:
        return _total([self._retired, *(cache.stats() for cache in self._live)])


def _total(stats: Iterable[PrefixStats]) -> PrefixStats:
    total = PrefixStats()
    for one in stats:
        total += one
    return total
