"""Is a server there at all? Checked before a run, so that a load test against a server that
is not running fails in a couple of seconds with one line, instead of counting a whole run of
connection errors."""

from __future__ import annotations

import socket

from load_test.client import Target

__all__ = ["CONNECT_TIMEOUT_S", "Unreachable", "check_reachable"]


class Unreachable(Exception):
    """No server answers where the run would send its load: one line, exit status 1."""


#: How long a connection to the server may take before the tool says nobody answers.
CONNECT_TIMEOUT_S = 2.0


def check_reachable(target: Target, grpc_target: str | None = None) -> None:
    """Fail fast, in one line, when nothing listens at ``target`` (or at the gRPC door a
    ``--api grpc`` run calls), instead of counting a whole run of connection errors.

    :raises Unreachable: naming the URL and how to start the server.
    """
    places = [(target.host, target.port, target.base)]
    if grpc_target is not None:
        grpc_host, _, grpc_port = grpc_target.rpartition(":")
        if grpc_port.isdigit():
            grpc_host = grpc_host.strip("[]") or "127.0.0.1"
            places.append((grpc_host, int(grpc_port), f"gRPC {grpc_target}"))
    for host, port, shown in places:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
            raise Unreachable(
                f"no server answers at {shown} ({reason}): start it with python server.py, "
                "or point --url at a running one"
            ) from None
