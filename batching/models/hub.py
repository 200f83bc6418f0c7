"""Models named as the Hugging Face Hub names them: ``--model ORG/NAME[@REVISION]``.

A hub id is fetched once, at start-up, into the Hugging Face cache by ``huggingface_hub``'s
``snapshot_download`` (``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HOME`` apply as everywhere), and
the server then serves the cached folder as it serves any local folder. The fetch runs in a
child process (this file, run as a script) whose environment says ``HF_HUB_OFFLINE`` as the
user set it: the serving process itself keeps the offline default ``server.py`` gives it, so
nothing it runs later reaches for the hub.

The rules (docs/models.md, "A model from the Hugging Face Hub"):

- a local folder of the same spelling always wins (the caller looks for one first);
- unless the user set ``HF_HUB_OFFLINE=1``, the revision (a branch, a tag or a commit; ``main``
  when none is given) is resolved on the hub and the snapshot of that commit downloaded, or
  found already complete in the cache;
- offline, or when the hub cannot be reached, the cached snapshot of that revision is used;
- with neither, the start stops with one line saying how to fetch the folder by hand.

Only the standard library is imported here; ``huggingface_hub`` is imported by the child.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HubError", "HubId", "Snapshot", "fetch", "offline_asked", "remember_offline_choice"]

#: ``org/name`` or ``org/name@revision``: what the hub's own ids look like (no leading dot,
#: slash or tilde, so a relative or home path is never read as one).
_HUB_ID = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w.-][\w./-]*))?"
)
_TRUE = {"1", "on", "yes", "true"}
#: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as the user set it, before server.py's default.
_asked: bool | None = None


class HubError(ValueError):
    """A hub id that cannot be served; the message is one line that says what to do."""


@dataclass(frozen=True, slots=True)
class HubId:
    repo: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubId | None:
        """The hub id ``text`` spells, or None when it is not one."""
        found = _HUB_ID.fullmatch(text)
        if found is None or ".." in text or "--" in found.group("repo"):
            return None
        return cls(found.group("repo"), found.group("revision"))

    @property
    def name(self) -> str:
        """The model's own name (``NAME`` of ``ORG/NAME``): what it is served as."""
        return self.repo.rpartition("/")[2]

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"

    def fetch_by_hand(self) -> str:
        revision = "" if self.revision is None else f" --revision {self.revision}"
        return f'"hf download {self.repo}{revision} --local-dir DIR", then serve --model DIR'


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A hub id's files in the Hugging Face cache."""

    path: Path
    #: The commit the revision resolved to: the snapshot served.
    commit: str
    #: True: resolved on the hub now; False: taken from the cache (offline, or unreachable).
    online: bool

    def describe(self, hub_id: HubId) -> str:
        how = "resolved on the hub" if self.online else "from the Hugging Face cache"
        return f"{hub_id.repo}@{self.commit} ({hub_id.revision or 'main'}, {how})"


def remember_offline_choice(environ: Mapping[str, str]) -> None:
    """Record whether the user asked for offline (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE``), before a default of the server's own is set."""
    global _asked
    _asked = _offline_in(environ)


def offline_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a hub id must come from the cache alone: what the user asked, as recorded by
    :func:`remember_offline_choice`, else what ``environ`` (``os.environ``) says now."""
    if _asked is not None and environ is None:
        return _asked
    return _offline_in(os.environ if environ is None else environ)


def _offline_in(environ: Mapping[str, str]) -> bool:
    return any(
        environ.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def fetch(hub_id: HubId, *, offline: bool | None = None) -> Snapshot:
    """The snapshot of ``hub_id``, downloaded into the cache when the network allows.

    :param offline: the cache alone (default: :func:`offline_asked`).
    :raises HubError: it cannot be had, with one line saying why and how to fetch it.
    """
    offline = offline_asked() if offline is None else offline
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    done = subprocess.run(
        [sys.executable, __file__, hub_id.repo, hub_id.revision or ""],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        why = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise HubError(f"--model {hub_id}: fetching it failed ({why[0][:200]})") from None
    if "path" in answer:
        return Snapshot(Path(answer["path"]), str(answer["commit"]), bool(answer["online"]))
    raise HubError(explain(hub_id, str(answer["error"]), str(answer.get("detail", "")), offline))


def explain(hub_id: HubId, error: str, detail: str, offline: bool) -> str:
    """The one line a failed fetch stops the start with."""
    start = f"--model {hub_id}"
    if error == "not_found":
        return (
            f"{start}: no local folder of that name, and the hub has no model {hub_id.repo} "
            "(or it is private: set HF_TOKEN to a token that may read it)"
        )
    if error == "gated":
        return (
            f"{start}: the hub asks for access to {hub_id.repo}: accept its terms on the hub, "
            "then set HF_TOKEN to a token of that account"
        )
    if error == "no_revision":
        return f"{start}: the hub has {hub_id.repo} but no revision {hub_id.revision}"
    why = (
        "HF_HUB_OFFLINE=1 is set"
        if offline
        else f"the hub cannot be reached ({detail or 'no answer'})"
    )
    return (
        f"{start}: no local folder of that name, no copy of it in the Hugging Face cache, and "
        f"{why}; where the network allows, fetch it with {hub_id.fetch_by_hand()}"
    )


# -- the child: run as a script, with the user's HF_HUB_OFFLINE ------------------------------


def _download(repo: str, revision: str | None) -> dict[str, object]:
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    commit: str | None = None
    reached = ""
    try:
        if not constants.HF_HUB_OFFLINE:
            try:
                commit = HfApi().model_info(repo, revision=revision).sha
            except (RepositoryNotFoundError, RevisionNotFoundError):  # gated ones included
                raise
            except Exception as exc:  # unreachable, or the hub failing: the cache may serve
                reached = type(exc).__name__
        # By the revision asked (not the commit), so the cache learns what it resolves to.
        path = snapshot_download(repo, revision=revision, local_files_only=commit is None)
    except GatedRepoError:
        return {"error": "gated"}
    except RepositoryNotFoundError:
        return {"error": "not_found"}
    except RevisionNotFoundError:
        return {"error": "no_revision"}
    except LocalEntryNotFoundError:
        return {"error": "not_cached", "detail": reached}
    return {"path": path, "commit": Path(path).name, "online": commit is not None}


if __name__ == "__main__":
    print(json.dumps(_download(sys.argv[1], sys.argv[2] or None)))
