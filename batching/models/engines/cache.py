"""The engine cache: exported models and start-up measurements kept on disk.

One folder per model and export recipe, named by a hash of the model folder's files (their
names and contents), the libraries that export, optimise and run it, and the kind of head
exported, so that a changed file or an upgraded library makes a new folder instead of serving
a stale export::

    <cache>/<key>/lock                   held while exporting and measuring
    <cache>/<key>/onnx/model.onnx        the export (written elsewhere, renamed into place)
    <cache>/<key>/onnx/model.fused.onnx  ONNX Runtime's optimised graph, when it fuses
    <cache>/<key>/onnx/*.shared/         initializers its sessions share, as .npy files
    <cache>/<key>/onnx/model.openvino/   the graph as OpenVINO's IR (its weights mapped)
    <cache>/<key>/onnx.error             why the export failed (not retried for this key)
    <cache>/<key>/decisions/<key>.json   what ``auto`` measured and chose, per machine setup

Two instances (threads or processes) that start together take the lock in turn: the second
finds the first one's export and measurements, instead of exporting again on the same cores.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = [
    "FUSED",
    "PLAIN",
    "RECIPE",
    "EngineCache",
    "ExportFailed",
    "library_versions",
    "model_digest",
]

#: The exported graph's file in ``onnx/``, and ONNX Runtime's fused graph beside it.
PLAIN = "model.onnx"
FUSED = "model.fused.onnx"

#: Bumped when the export recipe or what a decision records changes, so old entries are not
#: reused. 2: a decision notes whether the folder's tokenizer.json tokenises as transformers
#: does; an entry without that note made the serving process import transformers and torch.
RECIPE = "2"
_LIBRARIES = ("batching", "torch", "transformers", "onnx", "onnxruntime", "openvino")


class ExportFailed(RuntimeError):
    """The model could not be exported (now, or at an earlier start with the same key)."""


def library_versions() -> dict[str, str]:
    found = {}
    for name in _LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "absent"
    return found


def model_digest(folder: Path, memo: Path | None = None) -> str:
    """A hash of every file under ``folder``: relative names and contents.

    :param memo: a JSON file remembering the hash by the files' names, sizes and modification
        times, so that a start whose model did not change reads no weights to hash them.
    """
    if memo is None:
        return _digest(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    stats = [
        [str(p.relative_to(folder)), s.st_size, s.st_mtime_ns] for p in files for s in [p.stat()]
    ]
    key = _short({"folder": str(folder.resolve()), "files": stats})
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    found = known.get(key)
    if isinstance(found, str):
        return found
    digest = _digest(folder)
    known[key] = digest
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(memo, json.dumps(dict(list(known.items())[-256:])))
    except OSError:
        pass  # a read-only cache: hashed again at the next start
    return digest


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def _short(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]


class EngineCache:
    """The cache folder of one model folder and export head.

    :param root: the cache's root (``--engine-cache``).
    :param model: the model folder.
    :param head: what is exported ("base", "sequence-classification", "masked-lm").
    """

    def __init__(self, root: Path, model: Path, head: str) -> None:
        self.root = root
        files = model_digest(model, root / "digests.json")
        self.key = _short({"files": files, "head": head, "recipe": RECIPE, **library_versions()})
        self.folder = root / self.key

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this model's lock (across threads and processes) while exporting and
        measuring."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @property
    def export_folder(self) -> Path:
        return self.folder / "onnx"

    def export(self, make: Callable[[Path], None]) -> tuple[Path, bool]:
        """The exported folder, made by ``make(folder)`` unless it is already cached.

        Call it holding :meth:`locked`. ``make`` writes into a fresh temporary folder that is
        renamed into place only once complete, so a crash never leaves half an export.

        :returns: the folder, and whether it was reused from the cache.
        :raises ExportFailed: when ``make`` failed, now or at an earlier start with this key
            (the reason is kept, so a model that does not export is not retried).
        """
        done, failed = self.export_folder, self.folder / "onnx.error"
        if done.is_dir():
            return done, True
        if failed.is_file():
            reason = failed.read_text(encoding="utf-8").strip()
            raise ExportFailed(f"{reason} (at an earlier start; {failed})")
        self.folder.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".export-", dir=self.folder))
        try:
            make(work)
        except Exception as exc:
            shutil.rmtree(work, ignore_errors=True)
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            _write_atomically(failed, reason)
            raise ExportFailed(reason) from exc
        os.rename(work, done)
        return done, False

    def _decision_path(self, setup: Mapping[str, Any]) -> Path:
        return self.folder / "decisions" / f"{_short(setup)}.json"

    def decision(self, setup: Mapping[str, Any]) -> dict[str, Any] | None:
        """What was measured and chosen for this machine ``setup``, if it was."""
        path = self._decision_path(setup)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def save_decision(self, setup: Mapping[str, Any], data: Mapping[str, Any]) -> Path:
        path = self._decision_path(setup)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, json.dumps({"setup": dict(setup), **data}, indent=1))
        return path


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, path)
