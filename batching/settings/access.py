"""The key flags: ``--api-key`` and ``--api-key-file`` (every door asks for one of those
keys), ``--admin-api-key`` and ``--admin-api-key-file`` (the keys that may also load and
unload models), each with its ``BATCHING_*`` twin. What a key may do is
:class:`batching.keys.AccessKeys`'s business; this module reads the flags into it."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from batching.keys import AccessKeys, ApiKeyError, ApiKeys

from .flags import Parser, repeated

__all__ = ["add_key_flags", "read_keys"]


def add_key_flags(parser: Parser) -> None:
    """The four key flags."""
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


def read_keys(
    parser: argparse.ArgumentParser, args: argparse.Namespace, environ: Mapping[str, str]
) -> AccessKeys:
    """The keys the flags (or their variables) give.

    :raises SystemExit: a key or key file that cannot be used, or an admin key that is also an
        API key, with one line naming the flag (and the file), never a key.
    """
    try:
        api = _keys(args.api_key, args.api_key_file, "--api-key", environ)
        admin = _keys(args.admin_api_key, args.admin_api_key_file, "--admin-api-key", environ)
    except ApiKeyError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if api is not None and admin is not None and admin.shares_a_key_with(api):
        parser.exit(
            2,
            f"{parser.prog}: error: --admin-api-key: a key is also an API key (--api-key, "
            "--api-key-file): every holder of it could load and unload models; give admin keys "
            "of their own\n",
        )
    return AccessKeys(api=api, admin=admin)


def _keys(
    given: list[str] | None, file: str | None, flag: str, environ: Mapping[str, str]
) -> ApiKeys | None:
    keys = repeated(given, flag, environ)
    if not keys and not file:
        return None
    return ApiKeys(keys, file or None, flag=flag)
