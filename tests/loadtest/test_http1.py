"""``load_test.http1``: the built-in HTTP/1.1 client's framing."""

from __future__ import annotations

from load_test.http1 import _parse_chunked


def test_chunked_bodies_are_reassembled() -> None:
    raw = bytearray(b"HEAD\r\n\r\n4\r\nWiki\r\n6;ext=1\r\npedia \r\n0\r\n\r\nNEXT")
    body, consumed = _parse_chunked(raw, 8) or (b"", 0)
    assert body == b"Wikipedia "
    assert raw[consumed:] == b"NEXT"
    assert _parse_chunked(bytearray(b"4\r\nWi"), 0) is None
