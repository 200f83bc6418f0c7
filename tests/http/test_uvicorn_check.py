"""The uvicorn the connection layer extends: bounded in pyproject.toml, and checked at start-up,
so that a uvicorn without a method the layer overrides stops the start with one line."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batching.http.connections import protocol_class
from batching.http.limits import ConnectionLimits
from batching.http.uvicorn_check import SUPPORTED, USED, UvicornMismatch, check_uvicorn
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]

EVERY_METHOD = [(owner, name) for owner, names in USED.items() for name in names]


def test_the_installed_uvicorn_has_everything_the_connection_layer_extends() -> None:
    check_uvicorn()
    assert issubclass(protocol_class(ConnectionLimits()), HttpToolsProtocol)


def test_pyproject_accepts_the_versions_the_check_supports_and_the_installed_one_is_one() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (requirement,) = [
        dependency
        for dependency in project["project"]["dependencies"]
        if dependency.startswith("uvicorn")
    ]
    assert requirement == f"uvicorn[standard]{SUPPORTED}"
    check_uvicorn(version=uvicorn.__version__)


@pytest.mark.parametrize(
    ("owner", "name"), EVERY_METHOD, ids=[f"{o.__name__}.{n}" for o, n in EVERY_METHOD]
)
def test_a_uvicorn_without_a_method_the_layer_overrides_or_calls_is_refused_in_one_line(
    owner: type, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(owner, name)
    with pytest.raises(UvicornMismatch) as refused:
        protocol_class(ConnectionLimits())
    message = str(refused.value)
    assert "\n" not in message
    assert f"{owner.__name__}.{name}" in message
    assert message.endswith(f"install uvicorn{SUPPORTED}")


@pytest.mark.parametrize("starter", ["on_headers_complete", "on_response_complete"])
def test_a_uvicorn_that_starts_requests_without_the_overridden_method_is_refused(
    starter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def starts_otherwise(self: Any) -> None:
        self.loop.create_task(self.cycle.run_asgi(self.app))

    monkeypatch.setattr(HttpToolsProtocol, starter, starts_otherwise)
    with pytest.raises(UvicornMismatch, match=f"{starter} does not call _start_asgi_task"):
        check_uvicorn()


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("0.45.0", False),  # _start_asgi_task, but no connection: close for an early answer
        ("0.52.4", False),
        ("0.53.0", True),
        ("0.54.0", True),
        ("0.54.1rc1", True),
        ("0.55.0", False),
        ("1.0.0", False),
    ],
)
def test_only_the_versions_in_the_bound_pass(version: str, supported: bool) -> None:
    if supported:
        check_uvicorn(version=version)
    else:
        with pytest.raises(UvicornMismatch, match=f"uvicorn {version} is not a version"):
            check_uvicorn(version=version)


@pytest.mark.slow
def test_the_server_stops_at_start_with_one_line_when_uvicorn_lacks_the_overridden_method() -> None:
    # The server as a user starts it, in a process whose uvicorn has lost _start_asgi_task;
    # a server that started anyway would run until the timeout.
    script = (
        "import sys\n"
        "from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol\n"
        "del HttpToolsProtocol._start_asgi_task\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import server\n"
        f"server.main(['--port', '{free_port()}', '--grpc-port', '0'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"server.py: error: uvicorn {uvicorn.__version__} has no "
        "HttpToolsProtocol._start_asgi_task, which the connection layer overrides or calls: "
        f"install uvicorn{SUPPORTED}\n"
    )
