"""Start and stop a server process on 127.0.0.1 for the experiments that compare settings.

The command is a template (default ``{python} {server}``: this interpreter and this project's
``server.py``, wherever the tool is run from) run from ``cwd``; the tool appends
``--host 127.0.0.1 --port P`` and the setting's flags. Readiness is the server's
``GET /v2/health/ready`` answering 200 (another server's ready path where given); the
process's output goes to a log file so a failed start can be explained.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

__all__ = [
    "DEFAULT_COMMAND",
    "SERVER_SCRIPT",
    "ServerProcess",
    "ServerStartError",
    "command_argv",
    "free_port",
]

#: The project's ``server.py``: beside this package in a clone (and in an editable install),
#: and in ``site-packages`` beside it in a regular install (``py-modules = ["server"]``).
SERVER_SCRIPT = Path(__file__).resolve().parent.parent / "server.py"

#: ``{python}`` is this interpreter, ``{server}`` :data:`SERVER_SCRIPT`: the command works from
#: any directory, and the server still finds a ``--model package.module:Name`` from ``cwd``.
DEFAULT_COMMAND = "{python} {server}"


def command_argv(command: str) -> list[str]:
    """``command`` with ``{python}`` and ``{server}`` filled in, split as a shell would."""
    filled = command.replace("{python}", shlex.quote(sys.executable))
    return shlex.split(filled.replace("{server}", shlex.quote(str(SERVER_SCRIPT))))


class ServerStartError(RuntimeError):
    """The server exited or never became ready; the message ends with its log's tail."""


def free_port() -> int:
    """A port that was free a moment ago (the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServerProcess:
    """``with ServerProcess(args, ...) as server:`` starts, waits for ready, stops on exit."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        command: str = DEFAULT_COMMAND,
        cwd: Path | None = None,
        log_path: Path,
        ready_timeout: float = 300.0,
        env: dict[str, str] | None = None,
        ready_path: str = "/v2/health/ready",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = command_argv(command)
        self.argv = [*base, "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.cwd = cwd
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.env = {**os.environ, **(env or {})}
        self.ready_path = ready_path
        self.startup_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = started + self.ready_timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise ServerStartError(
                        f"server exited with {code} before it was ready: {shlex.join(self.argv)}"
                        f"\n--- {self.log_path} ---\n{_tail(self.log_path)}"
                    )
                try:
                    if client.get(self.url + self.ready_path).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass  # not listening yet: it binds only after loading the model
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"server not ready after {self.ready_timeout:.0f} s: "
                        f"{shlex.join(self.argv)}\n--- {self.log_path} ---\n{_tail(self.log_path)}"
                    )
                # Polling a child process's readiness: there is no event to wait on.
                time.sleep(0.1)
        self.startup_s = time.monotonic() - started

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGINT, then kill, each after ``timeout`` seconds; the exit code."""
        proc = self._proc
        if proc is None:
            return None
        for sig in (signal.SIGTERM, signal.SIGINT):
            if proc.poll() is None:
                proc.send_signal(sig)
                try:
                    return proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    continue
        if proc.poll() is None:
            proc.kill()
        return proc.wait()

    def __enter__(self) -> ServerProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
