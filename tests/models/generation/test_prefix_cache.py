"""The prefix cache's bookkeeping (pure, no model): chained block keys, the longest prefix
found, the bound in bytes with least recently used blocks out first and never a block whose
prefix has gone, the prefixes newcomers share, and the statistics several caches add up to."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching.models.generation.prefix_cache import PrefixCache, PrefixLedger, PrefixStats

BLOCK = 4
#: What every block holds in these tests: its tokens, costing 10 bytes.
SIZE = 10

Block = tuple[int, ...]


def cache(blocks_held: int) -> PrefixCache[Block]:
    return PrefixCache(blocks_held * SIZE, lambda _: SIZE, BLOCK)


def blocks_of(ids: Sequence[int]) -> list[Block]:
    return [tuple(ids[i : i + BLOCK]) for i in range(0, len(ids) - BLOCK + 1, BLOCK)]


def store(kept: PrefixCache[Block], ids: Sequence[int]) -> None:
    kept.store(ids, lambda index: blocks_of(ids)[index])


def test_a_prompt_finds_its_longest_held_prefix_shorter_than_itself() -> None:
    kept = cache(100)
    first = list(range(12))  # three whole blocks
    store(kept, first)
    assert kept.find(first) == blocks_of(first)[:2]  # one token at least must run
    assert kept.find([*first, 99]) == blocks_of(first)
    assert kept.find([*first[:6], 50, 51, 52, 53]) == blocks_of(first)[:1]
    assert kept.find([1, *first]) == []
    stats = kept.stats()
    assert (stats.hits, stats.misses, stats.reused_tokens) == (3, 1, 4 * (2 + 3 + 1))


def test_equal_blocks_after_different_prefixes_have_different_keys() -> None:
    kept = cache(100)
    a, b = [1, 2, 3, 4, 9, 9, 9, 9], [5, 6, 7, 8, 9, 9, 9, 9]
    assert kept.keys(a)[1] != kept.keys(b)[1]
    store(kept, a)
    assert kept.find([*b, 0]) == []


def test_a_prompt_shorter_than_two_blocks_finds_nothing_and_is_not_counted() -> None:
    kept = cache(100)
    store(kept, [1, 2, 3, 4])
    assert kept.find([1, 2, 3, 4]) == []
    assert kept.stats().hits == kept.stats().misses == 0


def test_the_least_recently_used_prompt_ends_go_first() -> None:
    kept = cache(4)
    old, new = list(range(8)), list(range(100, 108))
    store(kept, old)
    store(kept, new)
    assert kept.stats().entries == 4
    kept.find([*old, 0])  # old is used again: new's blocks are now the older ones
    store(kept, list(range(200, 204)))
    # new's last block went first; its first block, and all of old, stay.
    assert kept.held([*new, 0]) == 1 and kept.held([*old, 0]) == 2
    assert kept.stats().evictions == 1


def test_a_block_larger_than_the_whole_cache_is_not_kept() -> None:
    kept: PrefixCache[Block] = PrefixCache(SIZE - 1, lambda _: SIZE, BLOCK)
    store(kept, list(range(12)))
    assert kept.stats().entries == 0 and kept.stats().bytes == 0


def test_a_disabled_cache_asks_for_nothing() -> None:
    kept: PrefixCache[Block] = PrefixCache(0, lambda _: SIZE, BLOCK)

    def never(index: int) -> Block:
        raise AssertionError("a disabled cache built a block")

    kept.store(list(range(12)), never)
    assert kept.find(list(range(13))) == [] and not kept.enabled
    assert kept.shared([list(range(13)), list(range(13))]) == []


def test_newcomers_share_their_longest_common_prefix_not_yet_held() -> None:
    kept = cache(100)
    system = list(range(16))
    one, two = [*system, *range(50, 58), 1], [*system, *range(50, 58), 2]
    three, four = [*system, 7, 7, 7, 7, 3], [*system, 8, 8, 8, 8, 4]
    alone = [90, 91, 92, 93, 94, 95, 96, 97, 98]
    shared = kept.shared([one, two, three, four, alone])
    # one and two share 6 blocks; three and four the system's 4, which one and two start
    # with: computing the longer keeps it too.
    assert shared == [one[:24]]
    store(kept, one[:24])
    assert kept.shared([one, two, three, four]) == []  # what they share is held now


@settings(max_examples=60, deadline=None)
@given(
    room=st.integers(min_value=1, max_value=8),
    prompts=st.lists(
        st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=20),
        min_size=1,
        max_size=25,
    ),
)
def test_the_cache_never_holds_more_than_its_bound_nor_a_block_without_its_prefix(
    room: int, prompts: list[list[int]]
) -> None:
    kept = cache(room)
    for ids in prompts:
        held = kept.held(ids)
        found = kept.find(ids)
        assert found == blocks_of(ids)[:held]
        store(kept, ids)
        stats = kept.stats()
        assert stats.bytes == stats.entries * SIZE <= room * SIZE
        for earlier in prompts:
            chain = [key in kept for key in kept.keys(earlier)]
            assert chain == sorted(chain, reverse=True)  # held blocks: a run from the first


def test_statistics_add_up_across_instances_and_outlive_a_stopped_one() -> None:
    class Batch:
        def __init__(self, prefixes: PrefixCache[Block] | None) -> None:
            self.prefixes = prefixes

    ledger = PrefixLedger()
    first, second = cache(100), cache(100)
    ledger.track(Batch(None))
    assert not ledger.kept
    one, two = Batch(first), Batch(second)
    ledger.track(one)
    ledger.track(two)
    for kept in (first, second):
        store(kept, list(range(8)))
        kept.find(list(range(9)))
    total = ledger.stats()
    assert total == PrefixStats(
        capacity_bytes=2000, bytes=40, entries=4, hits=2, reused_tokens=16, misses=0
    )
    ledger.retire(one)
    after = ledger.stats()
    assert (after.bytes, after.capacity_bytes, after.hits) == (20, 1000, 2)


def test_a_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(-1, lambda _: SIZE, BLOCK)
