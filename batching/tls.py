"""The server's TLS certificates: read and checked at start, re-read when their files change.

One :class:`CertificateFiles` serves both doors. HTTP gets
:meth:`CertificateFiles.listening_context`, an ``ssl.SSLContext`` for uvicorn's listener whose
SNI callback (OpenSSL calls it on every handshake, with or without a server name) hands each new
connection the newest good context. gRPC gets the same reading's PEM bytes through grpcio's
certificate fetcher (:mod:`batching.grpc.tls`), which gRPC calls when it accepts a connection.
Connections already open keep the certificate they started with.

The reload rule: every :data:`POLL_SECONDS` (and whenever :meth:`CertificateFiles.check` is
called: ``server.py`` calls it on SIGHUP) each file's identity, size and modification time are
compared with those of the last reading. When one changed, the files are read and checked again
(a certificate chain, a key that matches it, a CA bundle that parses). A good set replaces the
current one for new connections; a bad one (half written, a key that does not match) leaves the
current one in place and logs one line, and is tried again when the files change again. A set
whose files change while it is being read is left for the next look, without a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CLIENT_CERT_MODES",
    "POLL_SECONDS",
    "CertificateFiles",
    "Certificates",
    "ClientCert",
    "TlsConfig",
    "TlsError",
    "load_certificates",
]

logger = logging.getLogger("batching")

#: How often the certificate files are looked at, in seconds.
POLL_SECONDS = 10.0

ClientCert = Literal["required", "optional", "none"]

#: ``--ssl-client-cert`` values: the client must present a certificate signed by
#: ``--ssl-ca-certs``; may present one (HTTP verifies it if presented); is not asked for one.
CLIENT_CERT_MODES: tuple[ClientCert, ...] = ("required", "optional", "none")

_VERIFY_MODES = {
    "required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}

_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?-----END CERTIFICATE-----", re.S)
_PRIVATE_KEY = re.compile(
    rb"-----BEGIN ((?:[A-Z]+ )*)PRIVATE KEY-----\r?\n.+?-----END \1PRIVATE KEY-----", re.S
)


class TlsError(ValueError):
    """A TLS setting or file that cannot be used; the message is one line that says what to
    fix."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Where the certificates are, and whether clients must present one."""

    #: PEM: the server's certificate, then any intermediates (and the key, without
    #: ``keyfile``).
    certfile: str
    #: PEM: the unencrypted private key of ``certfile``; None when ``certfile`` holds it.
    keyfile: str | None = None
    #: PEM: the CAs client certificates must chain to.
    ca_certs: str | None = None
    client_cert: ClientCert = "none"

    def __post_init__(self) -> None:
        if self.client_cert not in CLIENT_CERT_MODES:
            raise TlsError(
                f"--ssl-client-cert must be one of {', '.join(CLIENT_CERT_MODES)}, "
                f"not {self.client_cert!r}"
            )
        if self.client_cert != "none" and not self.ca_certs:
            raise TlsError(
                f"--ssl-client-cert {self.client_cert} needs --ssl-ca-certs: the CA bundle "
                "client certificates are verified against"
            )
        if self.client_cert == "none" and self.ca_certs:
            raise TlsError(
                "--ssl-ca-certs is only used to verify client certificates: add "
                "--ssl-client-cert required (or optional), or leave --ssl-ca-certs out"
            )

    @classmethod
    def from_flags(
        cls,
        certfile: str | None,
        keyfile: str | None,
        ca_certs: str | None,
        client_cert: str,
    ) -> TlsConfig | None:
        """The settings the ``--ssl-*`` flags ask for; None when they leave TLS off.

        :raises TlsError: a combination that cannot work, e.g. a key without a certificate.
        """
        if not certfile:
            given = [
                flag
                for flag, value in (
                    ("--ssl-keyfile", keyfile),
                    ("--ssl-ca-certs", ca_certs),
                    ("--ssl-client-cert " + client_cert, client_cert != "none"),
                )
                if value
            ]
            if given:
                raise TlsError(
                    f"{', '.join(given)} needs --ssl-certfile: TLS is on only with a certificate"
                )
            return None
        if client_cert not in CLIENT_CERT_MODES:
            raise TlsError(
                f"--ssl-client-cert must be one of {', '.join(CLIENT_CERT_MODES)}, "
                f"not {client_cert!r}"
            )
        return cls(certfile, keyfile or None, ca_certs or None, client_cert)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in (self.certfile, self.keyfile, self.ca_certs) if path)

    def describe(self) -> str:
        clients = {
            "required": "client certificates required",
            "optional": "client certificates optional",
            "none": "no client certificates",
        }[self.client_cert]
        return f"{clients}; files re-read every {POLL_SECONDS:g} s when they change"


@dataclass(frozen=True, slots=True)
class Certificates:
    """One good reading of the files: the HTTP context and the PEM bytes gRPC takes."""

    #: For the HTTP listener: the certificate, the key, the CAs and the verify mode.
    context: ssl.SSLContext
    #: The private key block, and the certificate blocks in order (server's first).
    private_key: bytes
    certificate_chain: bytes
    #: The CA certificate blocks, or None without ``--ssl-ca-certs``.
    root_certificates: bytes | None
    #: SHA-256 of the server certificate (DER), in hex: what ``openssl x509 -fingerprint``
    #: and the logs show.
    fingerprint: str


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise TlsError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def _refuse_password() -> bytes:
    # Never let OpenSSL prompt on a terminal for a passphrase: a server has nobody to ask.
    raise TlsError("the private key is encrypted; give it unencrypted")


def load_certificates(config: TlsConfig) -> Certificates:
    """Read and check the files of ``config``.

    :raises TlsError: a file is missing or unreadable, holds no PEM certificate or key, holds
        an encrypted key, or the key does not match the certificate.
    """
    chain_file = _read(config.certfile, "--ssl-certfile")
    key_flag, key_path = (
        ("--ssl-keyfile", config.keyfile) if config.keyfile else ("--ssl-certfile", config.certfile)
    )
    key_file = _read(key_path, key_flag) if config.keyfile else chain_file
    blocks = _CERTIFICATE.findall(chain_file)
    if not blocks:
        raise TlsError(f"--ssl-certfile {config.certfile}: no PEM certificate in it")
    key = _PRIVATE_KEY.search(key_file)
    if key is None:
        if b"Proc-Type: 4,ENCRYPTED" in key_file:
            raise TlsError(
                f"{key_flag} {key_path}: the private key is encrypted; give it unencrypted"
            )
        raise TlsError(f"{key_flag} {key_path}: no PEM private key in it")
    if key.group(1) == b"ENCRYPTED " or b"Proc-Type: 4,ENCRYPTED" in key.group(0):
        raise TlsError(f"{key_flag} {key_path}: the private key is encrypted; give it unencrypted")
    try:
        server_der = ssl.PEM_cert_to_DER_cert(blocks[0].decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raise TlsError(
            f"--ssl-certfile {config.certfile}: its first certificate is not valid PEM"
        ) from None

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(config.certfile, config.keyfile, password=_refuse_password)
    except TlsError as exc:
        raise TlsError(f"{key_flag} {key_path}: {exc}") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(
                f"the private key in {key_flag} {key_path} does not match the certificate in "
                f"--ssl-certfile {config.certfile}"
            ) from None
        raise TlsError(
            f"--ssl-certfile {config.certfile} or {key_flag} {key_path}: OpenSSL cannot load "
            f"them ({exc.reason or exc.strerror or exc})"
        ) from None
    except OSError as exc:
        raise TlsError(
            f"--ssl-certfile {config.certfile}: cannot read it ({exc.strerror})"
        ) from None

    roots: bytes | None = None
    if config.ca_certs:
        ca_file = _read(config.ca_certs, "--ssl-ca-certs")
        ca_blocks = _CERTIFICATE.findall(ca_file)
        if not ca_blocks:
            raise TlsError(f"--ssl-ca-certs {config.ca_certs}: no PEM certificate in it")
        roots = b"\n".join(ca_blocks) + b"\n"
        try:
            context.load_verify_locations(cadata=roots.decode("ascii"))
        except (ssl.SSLError, ValueError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TlsError(
                f"--ssl-ca-certs {config.ca_certs}: OpenSSL cannot load it ({reason})"
            ) from None
    context.verify_mode = _VERIFY_MODES[config.client_cert]
    return Certificates(
        context=context,
        private_key=key.group(0) + b"\n",
        certificate_chain=b"\n".join(blocks) + b"\n",
        root_certificates=roots,
        fingerprint=hashlib.sha256(server_der).hexdigest(),
    )


#: What a file looked like: device, inode, size and modification time; None when missing.
_Signature = tuple[tuple[int, int, int, int] | None, ...]


class CertificateFiles:
    """The certificates new connections get: the newest good reading of ``config``'s files.

    :param poll_seconds: how often :meth:`start`'s task looks at the files; 0: never.
    :param sleep: how it waits (tests inject their own clock).
    :raises TlsError: (on construction) the files cannot be used now.
    """

    def __init__(
        self,
        config: TlsConfig,
        *,
        poll_seconds: float = POLL_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.poll_seconds = poll_seconds
        self._sleep = sleep
        seen = self._signature()
        #: The newest good reading; replaced (never changed) by :meth:`check`.
        self.current = load_certificates(config)
        self._seen = seen
        self._task: asyncio.Task[None] | None = None

    def _signature(self) -> _Signature:
        def one(path: str) -> tuple[int, int, int, int] | None:
            try:
                stat = os.stat(path)  # follows symlinks: a Kubernetes Secret's swap shows
            except OSError:
                return None
            return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)

        return tuple(one(path) for path in self.config.paths)

    def check(self) -> bool:
        """Read the files again if they changed since the last reading; whether new
        connections now get a new certificate."""
        before = self._signature()
        if before == self._seen:
            return False
        try:
            loaded = load_certificates(self.config)
        except TlsError as exc:
            if self._signature() != before:
                return False  # still being written: the next look reads the finished files
            self._seen = before
            logger.warning(
                "TLS: kept the current certificate (sha256 %s): %s; the files are read again "
                "when they change",
                self.current.fingerprint[:16],
                exc,
            )
            return False
        if self._signature() != before:
            return False
        self._seen = before
        previous, self.current = self.current, loaded
        logger.info(
            "TLS: new connections get the certificate sha256 %s (was %s)",
            loaded.fingerprint[:16],
            previous.fingerprint[:16],
        )
        return True

    # ---------------------------------------------------------------------------- HTTP

    def listening_context(self) -> ssl.SSLContext:
        """The context for the HTTP listener: the reading at hand, whose SNI callback gives
        each new handshake the newest reading's context instead."""
        base = self.current.context
        base.sni_callback = self._newest
        return base

    def _newest(
        self,
        connection: ssl.SSLObject | ssl.SSLSocket,
        server_name: str | None,
        base: ssl.SSLContext,
    ) -> None:
        context = self.current.context
        if context is not base:
            connection.context = context

    # ------------------------------------------------------------------------ polling

    def start(self) -> None:
        """Look at the files every :attr:`poll_seconds` on the running event loop."""
        if self._task is None and self.poll_seconds > 0:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll(self) -> None:
        while True:
            await self._sleep(self.poll_seconds)
            self.check()
