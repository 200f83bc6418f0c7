"""The probes' reserve: connections beyond the cap, one probe each, the oldest silent one
evicted for a newcomer (batching/http/probes.py); the connection layer's use of it is tested
against a real server in test_http_limits.py."""

from __future__ import annotations

from batching.http.probes import ProbeReserve


class Connection:
    """A reserved connection as the reserve sees it: silent or not, and evicted by it."""

    def __init__(self, reserve: ProbeReserve[Connection], silent: bool = True) -> None:
        self.reserve = reserve
        self.is_silent = silent
        self.evicted = False

    def silent(self) -> bool:
        return self.is_silent

    def evict(self) -> None:
        self.evicted = True
        self.reserve.release(self)


def test_connections_take_the_free_slots_then_the_oldest_silent_one_gives_way() -> None:
    reserve: ProbeReserve[Connection] = ProbeReserve(2)
    first, second, third = Connection(reserve), Connection(reserve), Connection(reserve)
    assert reserve.take(first) and reserve.take(second)
    assert reserve.take(third)
    assert first.evicted and not second.evicted
    assert len(reserve) == 2


def test_a_connection_that_sent_its_request_keeps_its_slot() -> None:
    reserve: ProbeReserve[Connection] = ProbeReserve(2)
    talking, silent = Connection(reserve, silent=False), Connection(reserve)
    assert reserve.take(talking) and reserve.take(silent)
    assert reserve.take(Connection(reserve))
    assert silent.evicted and not talking.evicted


def test_without_a_silent_connection_a_newcomer_is_refused() -> None:
    reserve: ProbeReserve[Connection] = ProbeReserve(2)
    for _ in range(2):
        assert reserve.take(Connection(reserve, silent=False))
    assert not reserve.take(Connection(reserve))
    assert len(reserve) == 2


def test_a_released_slot_is_free_again_and_an_empty_reserve_takes_none() -> None:
    reserve: ProbeReserve[Connection] = ProbeReserve(2)
    first = Connection(reserve, silent=False)
    assert reserve.take(first) and reserve.take(Connection(reserve, silent=False))
    reserve.release(first)
    assert reserve.take(Connection(reserve, silent=False))
    none: ProbeReserve[Connection] = ProbeReserve(0)
    assert not none.take(Connection(none))
