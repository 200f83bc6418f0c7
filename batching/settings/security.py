"""The security flags: TLS on both doors (``--ssl-certfile``, ``--ssl-keyfile``,
``--ssl-ca-certs``, ``--ssl-client-cert``), the keys (``--api-key`` and ``--api-key-file``:
every door asks for one of those keys; ``--admin-api-key`` and ``--admin-api-key-file``: the
keys that may also load and unload models) and the origins browsers may call from
(``--cors-allow-origin``), each with its ``BATCHING_*`` twin. What a key may do is
:class:`batching.keys.AccessKeys`'s business; this module reads the flags into it."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TypedDict
from urllib.parse import urlsplit

from batching.keys import AccessKeys, ApiKeys
from batching.tls import CLIENT_CERT_MODES, TlsConfig, load_certificates

from .flags import Parser, fail, one_line, repeated

__all__ = ["Security", "add_security_flags", "read_security"]


class Security(TypedDict):
    """TLS, the keys and the CORS origins the flags ask for (fields of ServerSettings)."""

    tls: TlsConfig | None
    api_keys: ApiKeys | None
    admin_keys: ApiKeys | None
    cors_allow_origins: tuple[str, ...]


def add_security_flags(parser: Parser) -> None:
    _add_tls_flags(parser)
    _add_key_flags(parser)
    parser.repeated_flag(
        "--cors-allow-origin",
        help="an origin (https://app.example.com, or * for any) whose pages may call the "
        "server from a browser; unset: CORS is off",
    )


def _add_tls_flags(parser: Parser) -> None:
    parser.flag(
        "--ssl-certfile",
        help="serve HTTP and gRPC over TLS with this PEM certificate chain (the server's "
        "certificate first); re-read for new connections when it changes",
    )
    parser.flag(
        "--ssl-keyfile",
        help="the unencrypted PEM private key of --ssl-certfile (unset: it is in --ssl-certfile)",
    )
    parser.flag(
        "--ssl-ca-certs",
        help="PEM bundle of the CAs client certificates must be signed by (mutual TLS; "
        "needs --ssl-client-cert required or optional)",
    )
    parser.flag(
        "--ssl-client-cert",
        default="none",
        choices=CLIENT_CERT_MODES,
        help="required: a client without a certificate signed by --ssl-ca-certs is refused; "
        "optional: HTTP asks for one and verifies it if sent (gRPC cannot ask without "
        "requiring: it takes every TLS client); none: no client certificates",
    )


def _add_key_flags(parser: Parser) -> None:
    parser.repeated_flag(
        "--api-key",
        help="a key every door then asks for (HTTP Authorization: Bearer KEY or api-key: KEY; "
        "gRPC metadata authorization: Bearer KEY), except the health probes and /metrics; "
        "prefer --api-key-file, which ps does not show",
    )
    parser.flag(
        "--api-key-file",
        help="a file of keys, one per line (a mounted Kubernetes Secret): re-read when it "
        "changes, so keys rotate without a restart; empty or unreadable at start is an error",
    )
    parser.repeated_flag(
        "--admin-api-key",
        help="a key that may also load and unload models (POST /v2/repository/models/NAME/load "
        "and .../unload, gRPC RepositoryModelLoad/Unload), sent as an API key is, and taken "
        "wherever one is; with --model-control-mode explicit and API keys, no one may load or "
        "unload without one (docs/security.md); prefer --admin-api-key-file",
    )
    parser.flag(
        "--admin-api-key-file",
        help="a file of admin keys, one per line, re-read when it changes (as --api-key-file)",
    )


def read_security(args: argparse.Namespace, environ: Mapping[str, str]) -> Security:
    """The security flags (or their variables in ``environ``), checked: the certificate files
    read and matched, the key files read.

    :raises BadSetting: TLS that cannot be served, a key or key file that cannot be used (one
        line naming the flag and the file, never a key), or a CORS origin that is not one.
    """
    with one_line():
        tls = TlsConfig.from_flags(
            args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs, str(args.ssl_client_cert)
        )
        if tls is not None:
            load_certificates(tls)  # a missing file or a key that does not match: one line
    keys = _read_keys(args, environ)
    with one_line():
        origins = tuple(
            _origin(origin)
            for origin in repeated(args.cors_allow_origin, "--cors-allow-origin", environ)
        )
    return Security(tls=tls, api_keys=keys.api, admin_keys=keys.admin, cors_allow_origins=origins)


def _read_keys(args: argparse.Namespace, environ: Mapping[str, str]) -> AccessKeys:
    with one_line():
        api = _keys(args.api_key, args.api_key_file, "--api-key", environ)
        admin = _keys(args.admin_api_key, args.admin_api_key_file, "--admin-api-key", environ)
    if api is not None and admin is not None and admin.shares_a_key_with(api):
        fail(
            "--admin-api-key: a key is also an API key (--api-key, --api-key-file): every "
            "holder of it could load and unload models; give admin keys of their own"
        )
    return AccessKeys(api=api, admin=admin)


def _keys(
    given: list[str] | None, file: str | None, flag: str, environ: Mapping[str, str]
) -> ApiKeys | None:
    keys = repeated(given, flag, environ)
    if not keys and not file:
        return None
    return ApiKeys(keys, file or None, flag=flag)


def _origin(origin: str) -> str:
    """A CORS origin as browsers send it: ``scheme://host[:port]``, or ``*`` for any."""
    if origin == "*":
        return origin
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(
            f"--cors-allow-origin: {origin!r} is not an origin (scheme://host[:port], or *)"
        )
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"--cors-allow-origin: {origin!r} is not an origin")
    return f"{parts.scheme}://{parts.netloc}"
