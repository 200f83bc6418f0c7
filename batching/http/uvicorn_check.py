"""What the connection layer takes from uvicorn, checked before a server is built on it.

:mod:`batching.http.connections` subclasses uvicorn's httptools protocol and
:mod:`batching.http.lingering` its request cycle. Some of what they override is private to
uvicorn: ``_start_asgi_task`` (where a complete request's handler starts, which early resends
defer) exists from uvicorn 0.45, and the ``connection: close`` that an early answer relies on is
written by uvicorn's request cycle from 0.53. ``pyproject.toml`` accepts the versions that have
both (:data:`SUPPORTED`); :func:`check_uvicorn` is the start-up check that the one installed
still has every method the layer overrides or calls, and still starts each request through
``_start_asgi_task``, so that a uvicorn changed under it stops the start with one line instead
of serving with its limits silently gone. What no method's presence shows (the ``connection:
close`` of 0.53) is checked by the version: one outside :data:`SUPPORTED` is refused too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["SUPPORTED", "UvicornMismatch", "check_uvicorn"]

#: The uvicorn versions whose protocol the connection layer extends: from the first, up to
#: (not including) the last (as ``pyproject.toml`` says, in :data:`SUPPORTED`).
OLDEST, BEYOND = (0, 53), (0, 55)
SUPPORTED = f">={OLDEST[0]}.{OLDEST[1]},<{BEYOND[0]}.{BEYOND[1]}"

#: The methods of uvicorn's classes that the connection layer overrides or calls.
USED: Mapping[type, tuple[str, ...]] = {
    HttpToolsProtocol: (
        "connection_made",
        "connection_lost",
        "eof_received",
        "data_received",
        "send_400_response",
        "on_header",
        "on_headers_complete",
        "on_message_begin",
        "on_body",
        "on_message_complete",
        "on_response_complete",
        "_start_asgi_task",
        "_unset_keepalive_if_required",
    ),
    RequestResponseCycle: ("send",),
}

#: uvicorn's methods that must start a request's handler through ``_start_asgi_task``, or
#: overriding it would not hold early resends: a request complete on arrival, and a request
#: that waited for the answer before it on its connection.
STARTERS = ("on_headers_complete", "on_response_complete")


class UvicornMismatch(RuntimeError):
    """The installed uvicorn lacks what the connection layer extends; one line says what."""


def check_uvicorn(
    used: Mapping[type, tuple[str, ...]] = USED, version: str = uvicorn.__version__
) -> None:
    """Check that uvicorn's protocol and request cycle have every method in ``used``, and
    that the protocol starts requests through ``_start_asgi_task``.

    :raises UvicornMismatch: naming the first thing missing and the versions supported.
    """
    if not OLDEST <= _release(version) < BEYOND:
        raise _mismatch(f"uvicorn {version} is not a version the connection layer extends")
    for owner, names in used.items():
        for name in names:
            if not _uvicorn_defines(owner, name):
                raise _mismatch(
                    f"uvicorn {version} has no {owner.__name__}.{name}, which the connection "
                    "layer overrides or calls"
                )
    for name in STARTERS:
        if "_start_asgi_task" not in _names_called(getattr(HttpToolsProtocol, name)):
            raise _mismatch(
                f"uvicorn {version}'s HttpToolsProtocol.{name} does not call _start_asgi_task, "
                "which the connection layer overrides"
            )


def _release(version: str) -> tuple[int, ...]:
    """``0.54.0`` as ``(0, 54, 0)``; what follows a release's numbers (``rc1``) is left out."""
    numbers = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers)


def _uvicorn_defines(owner: type, name: str) -> bool:
    """Whether uvicorn's own code (not asyncio's base classes) defines ``owner.name``: what a
    subclass's ``super()`` call must reach."""
    return any(
        callable(vars(klass).get(name))
        for klass in owner.__mro__
        if klass.__module__.partition(".")[0] == "uvicorn"
    )


def _names_called(method: Callable[..., object]) -> tuple[str, ...]:
    code = getattr(method, "__code__", None)
    return () if code is None else tuple(code.co_names)


def _mismatch(what: str) -> UvicornMismatch:
    return UvicornMismatch(f"{what}: install uvicorn{SUPPORTED}")
