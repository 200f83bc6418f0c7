"""A local stand-in for the Hugging Face Hub's download API, for the real huggingface_hub client
pointed at it with ``HF_ENDPOINT``.

It serves model repositories (folders on disk) at one commit each, behind the endpoints
``snapshot_download`` calls: the model info of a revision (which resolves it to a commit), the
recursive file listing of a commit, and ``resolve/<revision>/<file>`` with the ``X-Repo-Commit``
and ``ETag`` headers the client checks. It answers 404s with the hub's ``X-Error-Code`` so the
client raises the hub's own errors, and remembers every request (path and Authorization).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Repo:
    folder: Path
    commit: str
    #: Branch or tag names that resolve to ``commit``.
    refs: tuple[str, ...] = ("main",)

    def files(self) -> dict[str, Path]:
        return {
            path.relative_to(self.folder).as_posix(): path
            for path in sorted(self.folder.rglob("*"))
            if path.is_file()
        }


def blob_id(data: bytes) -> str:
    """git's blob id, which the hub gives a file that is not in LFS as its ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    #: (method, path, Authorization header) of every request, in order.
    requests: list[tuple[str, str, str]] = field(default_factory=list)

    def find(self, path: str) -> tuple[Repo | None, str, str]:
        """The repo a path names, and the rest of the path after the repo id."""
        for repo_id, repo in self.repos.items():
            for prefix in (f"/api/models/{repo_id}", f"/{repo_id}/"):
                if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                    return repo, repo_id, path[len(prefix.rstrip("/")) :]
        return None, "", path


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for name, value in {"Content-Length": str(len(data)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def missing(self, code: str, body: bool) -> None:
            data = json.dumps({"error": code}).encode()
            self.send(404, data, {"X-Error-Code": code, "Content-Type": "application/json"}, body)

        def answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Authorization", "")))
            repo, repo_id, rest = hub.find(path)
            if repo is None:
                self.missing("RepoNotFound", body)
                return
            api = path.startswith("/api/models/")
            if api and rest.startswith("/tree/"):
                revision = rest[len("/tree/") :].split("/")[0]
                if revision != repo.commit:
                    self.missing("RevisionNotFound", body)
                    return
                listing = []
                for name, file in repo.files().items():
                    data = file.read_bytes()
                    listing.append(
                        {"type": "file", "oid": blob_id(data), "size": len(data), "path": name}
                    )
                self.json(listing, body)
                return
            if api:
                revision = rest[len("/revision/") :] if rest.startswith("/revision/") else "main"
                if revision not in (repo.commit, *repo.refs):
                    self.missing("RevisionNotFound", body)
                    return
                siblings = [{"rfilename": name} for name in repo.files()]
                info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit}
                self.json({**info, "private": False, "siblings": siblings}, body)
                return
            if rest.startswith("/resolve/"):
                revision, _, name = rest[len("/resolve/") :].partition("/")
                if revision not in (repo.commit, *repo.refs):
                    self.missing("RevisionNotFound", body)
                    return
                file = repo.files().get(name)
                if file is None:
                    self.missing("EntryNotFound", body)
                    return
                data = file.read_bytes()
                headers = {
                    "X-Repo-Commit": repo.commit,
                    "ETag": f'"{blob_id(data)}"',
                    "Content-Type": "application/octet-stream",
                }
                self.send(200, data, headers, body)
                return
            self.missing("EntryNotFound", body)

        def json(self, value: object, body: bool) -> None:
            data = json.dumps(value).encode()
            self.send(200, data, {"Content-Type": "application/json"}, body)

    return Handler


@contextmanager
def serving(hub: FakeHub) -> Iterator[str]:
    """Serve ``hub`` on a free port of 127.0.0.1; yields its endpoint URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
