"""A URL on 127.0.0.1 that serves a valid file and records every request to it: a server that
fetched a URL sent as request content would show up in :attr:`Trap.seen`."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trap:
    url: str
    #: The paths requested so far.
    seen: list[str] = field(default_factory=list)


@contextlib.contextmanager
def url_trap(body: bytes, content_type: str, name: str) -> Iterator[Trap]:
    """Serve ``body`` as ``content_type`` at ``/name`` on a free port, for the block."""
    trap = Trap("")

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            trap.seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    trap.url = f"http://127.0.0.1:{server.server_address[1]}/{name}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield trap
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
