"""API keys: the configured keys (as SHA-256 digests), the credential a request presents, and the
constant-time check both doors (HTTP and gRPC) make.

Keys come from ``--api-key`` (repeatable) and ``--api-key-file`` (one key per line); admin keys,
which may also load and unload models (Triton's restricted repository API), from
``--admin-api-key`` and ``--admin-api-key-file``: each set is an :class:`ApiKeys`, and
:class:`AccessKeys` says what a credential may do with both. The file is
re-read when it changes, so a Kubernetes Secret mounted as the file rotates keys without a
restart: the check looks at the file's identity (device, inode, size, modification time, after
symlinks, which is how kubelet swaps a Secret's ``..data`` link) at most once per
:data:`RECHECK_INTERVAL_S`, on the request path. No watcher thread or task to manage, it works
the same under ``python server.py`` and ``uvicorn server:app``, and costs one ``stat`` a second.
A file that becomes empty or unreadable keeps the keys read last (logged as an error): a server
meant to be locked is never opened by a half-written file.

Nothing here keeps a key's text: only its digest. A presented credential is hashed and compared
with ``hmac.compare_digest`` against every configured digest, with no early exit, so neither
which key matched nor how much of it did shows in the time the check takes (nor, with
admin keys, whether it was an API key or an admin key).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "KEY_SEPARATOR",
    "RECHECK_INTERVAL_S",
    "AccessKeys",
    "ApiKeys",
    "ApiKeyError",
    "KeyCheck",
    "credential_of",
    "split_keys",
]

logger = logging.getLogger("batching")

#: Several keys in one ``BATCHING_API_KEY`` variable are separated by commas.
KEY_SEPARATOR = ","

#: How often, at most, the key file's identity is looked at again (seconds).
RECHECK_INTERVAL_S = 1.0

#: A key travels in an HTTP header and in gRPC metadata: visible ASCII, no spaces or commas.
_KEY = re.compile(r"^[\x21-\x2b\x2d-\x7e]+$")


class ApiKeyError(ValueError):
    """A key or key file that cannot be used; the message says which and why, never the key."""


def _digest(key: str | bytes) -> bytes:
    raw = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key
    return hashlib.sha256(raw).digest()


def _checked(key: str, where: str) -> str:
    if not _KEY.match(key):
        raise ApiKeyError(
            f"{where}: a key must be printable ASCII without spaces or commas "
            "(it travels in an HTTP header)"
        )
    return key


def split_keys(text: str) -> list[str]:
    """The keys of one ``--api-key`` value: comma-separated (so ``BATCHING_API_KEY`` can hold
    several), surrounding spaces dropped."""
    return [part.strip() for part in text.split(KEY_SEPARATOR) if part.strip()]


def _read_file(path: Path, flag: str) -> list[str]:
    """The keys in ``path`` (given as ``flag``): one per line, blank lines and surrounding
    spaces ignored."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ApiKeyError(f"{flag} {path}: cannot be read ({reason})") from None
    keys = [line.strip() for line in text.splitlines() if line.strip()]
    if not keys:
        raise ApiKeyError(f"{flag} {path}: holds no key (one key per line)")
    for number, key in enumerate(keys, 1):
        _checked(key, f"{flag} {path}, key {number}")
    return keys


def _any_matches(presented: bytes, digests: Iterable[bytes]) -> bool:
    """Whether ``presented`` is one of ``digests``: compared in constant time with every one
    (no early exit)."""
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(presented, digest)
    return matched


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def credential_of(headers: Iterable[tuple[str, str]]) -> str | None:
    """The key a request presents: ``authorization: Bearer KEY`` (scheme in any case), else
    ``api-key: KEY`` (Azure-style clients). ``headers`` are (lowercase name, value) pairs: HTTP
    headers or gRPC metadata. The first of each header counts."""
    bearer: str | None = None
    api_key: str | None = None
    seen_authorization = False
    for name, value in headers:
        if name == "authorization" and not seen_authorization:
            seen_authorization = True
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
        elif name == "api-key" and api_key is None:
            api_key = value.strip()
    return bearer if bearer is not None else api_key or None


class ApiKeys:
    """The keys a server accepts: those given at start, and those in a key file, re-read when
    the file changes.

    :param keys: keys given directly (``--api-key``).
    :param file: a key file (``--api-key-file``): read now, and again when it changes.
    :param flag: the flag the keys were given with, for messages (``--admin-api-key`` for
        the admin keys; the file's is the same with ``-file``).
    :param clock: monotonic seconds, for the re-check interval (injected by tests).
    :raises ApiKeyError: a key is malformed, the file cannot be read or holds no key, or no
        key is given at all.
    """

    def __init__(
        self,
        keys: Sequence[str] = (),
        file: str | os.PathLike[str] | None = None,
        *,
        flag: str = "--api-key",
        clock: Callable[[], float] = time.monotonic,
        recheck_interval: float = RECHECK_INTERVAL_S,
    ) -> None:
        self.flag = flag
        self._file_flag = f"{flag}-file"
        self._fixed = [_digest(_checked(key, flag)) for key in keys]
        self._file = None if file is None else Path(file)
        self._clock = clock
        self._interval = recheck_interval
        self._from_file: list[bytes] = []
        self._identity: tuple[int, int, int, int] | None = None
        self._checked_at = clock()
        if self._file is not None:
            self._identity = _identity(self._file)
            self._from_file = [_digest(key) for key in _read_file(self._file, self._file_flag)]
        if not self._fixed and not self._from_file:
            raise ApiKeyError(f"{flag}: give at least one key")

    @property
    def count(self) -> int:
        """How many keys are accepted now."""
        return len(self._fixed) + len(self._from_file)

    def reload_if_changed(self) -> None:
        """Re-read the key file if its identity changed since it was last read (looked at no
        more than once per interval). A file that cannot be used keeps the keys read last."""
        if self._file is None:
            return
        now = self._clock()
        if now - self._checked_at < self._interval:
            return
        self._checked_at = now
        identity = _identity(self._file)
        if identity is None or identity == self._identity:
            if identity is None and self._identity is not None:
                logger.error(
                    "%s %s is gone; keeping the keys read last", self._file_flag, self._file
                )
                self._identity = None
            return
        self._identity = identity
        try:
            keys = _read_file(self._file, self._file_flag)
        except ApiKeyError as exc:
            logger.error("%s; keeping the keys read last", exc)
            return
        self._from_file = [_digest(key) for key in keys]
        logger.info("%s %s re-read: %d keys", self._file_flag, self._file, len(keys))

    def _digests(self) -> tuple[bytes, ...]:
        self.reload_if_changed()
        return (*self._fixed, *self._from_file)

    def accepts(self, credential: str | None) -> bool:
        """Whether ``credential`` is one of the keys: hashed, then compared in constant time
        with every key (no early exit)."""
        presented = _digest(credential if credential is not None else "")
        return _any_matches(presented, self._digests()) and credential is not None

    def shares_a_key_with(self, other: ApiKeys) -> bool:
        """Whether a key of these is also one of ``other``'s (an admin key that is also an
        API key would make every holder of that API key an admin)."""
        return bool(set(self._digests()) & set(other._digests()))


class KeyCheck(Protocol):
    """What a door asks of the keys: whether a credential may pass it."""

    def accepts(self, credential: str | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class AccessKeys:
    """A server's keys, and what a credential may do with them.

    - ``api``: with them, every route and RPC but the probes and ``/metrics`` needs a key;
    - ``admin``: the keys that may also load and unload models (Triton's restricted
      repository API); every door takes one where it takes an API key.

    Who may load and unload: an admin key when there are admin keys; no one when there are
    only API keys (a keyed server whose operator set no admin key has not opened its models
    to its API key holders); everyone on a server without keys at all (a development server:
    nothing else on it is guarded either).
    """

    api: ApiKeys | None = None
    admin: ApiKeys | None = None

    def accepts(self, credential: str | None) -> bool:
        """Whether ``credential`` passes the doors: an API key or an admin key. Compared with
        every key of both, in constant time (no early exit)."""
        presented = _digest(credential if credential is not None else "")
        matched = False
        for keys in (self.api, self.admin):
            if keys is not None:
                matched |= _any_matches(presented, keys._digests())
        return matched and credential is not None

    def control_refusal(self, credential: str | None) -> str | None:
        """Why ``credential`` may not load or unload models (a message that names the flag,
        never a key); None when it may."""
        if self.admin is not None:
            if self.admin.accepts(credential):
                return None
            presented = (
                "presents no key" if credential is None else "presents a key that is not one"
            )
            return (
                "loading and unloading models needs an admin key (--admin-api-key); "
                f"this request {presented}"
            )
        if self.api is not None:
            return (
                "loading and unloading models needs an admin key, and this server has none: "
                "start it with --admin-api-key or --admin-api-key-file (an API key may not)"
            )
        return None

    def control_warning(self) -> str | None:
        """What the log should say of who may load and unload, when it is everyone or no
        one."""
        if self.admin is not None:
            return None
        if self.api is not None:
            return (
                "load and unload calls are refused: this server has API keys but no admin key "
                "(--admin-api-key or --admin-api-key-file)"
            )
        return (
            "this server has no keys: anyone who reaches its port may load and unload models "
            "(set --admin-api-key to restrict them)"
        )
