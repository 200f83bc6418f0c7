"""``--model ORG/NAME[@REVISION]``: a model named as the Hugging Face Hub names it, fetched by the
real huggingface_hub client from a local stand-in for the hub (``HF_ENDPOINT``), served from the
Hugging Face cache, online and then offline; and the one line a start without either gets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batching.models.hub import HubId, fetch
from batching.models.source import ModelSource
from batching.settings.repository import load_repository
from tests.support import tiny
from tests.support.fake_hub import FakeHub, Repo, serving
from tests.support.server_process import ROOT, ServerProcess

COMMIT = "3f" * 20
FAST = ["--engine", "torch", "--precision", "fp32", "--max-batch-size", "4"]


@pytest.mark.parametrize(
    ("text", "repo", "revision"),
    [
        ("BAAI/bge-small-en-v1.5", "BAAI/bge-small-en-v1.5", None),
        ("org/tiny@main", "org/tiny", "main"),
        (f"org/tiny@{COMMIT}", "org/tiny", COMMIT),
        ("org/tiny@refs/pr/1", "org/tiny", "refs/pr/1"),
    ],
)
def test_a_hub_id_is_read_with_its_revision(text: str, repo: str, revision: str | None) -> None:
    hub_id = HubId.parse(text)
    assert hub_id == HubId(repo, revision)
    assert str(hub_id) == text
    assert hub_id is not None and hub_id.name == repo.rpartition("/")[2]


@pytest.mark.parametrize(
    "text",
    ["./org/tiny", "/models/tiny", "~/tiny", "tiny", "pkg.models:Name", "org/../x", "org//x"],
)
def test_paths_and_classes_are_never_read_as_hub_ids(text: str) -> None:
    assert HubId.parse(text) is None


@pytest.fixture
def hub_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, and the environment of a user who set no offline mode."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return home


@pytest.fixture
def hub(tmp_path: Path) -> FakeHub:
    """A hub holding ``org/tiny``: a sentence-transformers folder written by save_pretrained."""
    folder = tiny.sentence_folder(tmp_path / "published", "tiny")
    return FakeHub({"org/tiny": Repo(folder, COMMIT)})


@pytest.fixture
def endpoint(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with serving(hub) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield url


def embed(server: ServerProcess) -> list[float]:
    answer = httpx.post(f"{server.url}/models/tiny", content=b"the cat sat", timeout=30)
    assert answer.status_code == 200, answer.text
    (vector,) = answer.json()["outputs"]
    return list(vector)


@pytest.mark.slow
def test_a_hub_id_is_downloaded_served_and_then_served_offline_from_the_cache(
    hub: FakeHub, endpoint: str, hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_reader")
    server = ServerProcess(*FAST, model=["--model", "org/tiny"])
    try:
        # The revision is pinned in the log: the commit main resolved to.
        line = server.wait_for("serving tiny (")
        assert f"org/tiny@{COMMIT} (main, resolved on the hub)" in line
        online = embed(server)
    finally:
        server.stop()
    downloads = [request for request in hub.requests if f"/resolve/{COMMIT}/" in request[1]]
    assert {"config.json", "modules.json", "model.safetensors"} <= {
        request[1].rpartition("/")[2] for request in downloads
    }
    # HF_TOKEN goes to the hub on every request for the model.
    assert all(auth == "Bearer hf_reader" for _, path, auth in hub.requests if "org/tiny" in path)
    snapshot = hub_home / "hub" / "models--org--tiny" / "snapshots" / COMMIT
    assert (snapshot / "config.json").is_file()

    # The hub is gone: with HF_HUB_OFFLINE=1 the cached snapshot serves the same model.
    asked = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    server = ServerProcess(*FAST, model=["--model", "org/tiny"])
    try:
        line = server.wait_for("serving tiny (")
        assert f"org/tiny@{COMMIT} (main, from the Hugging Face cache)" in line
        assert embed(server) == pytest.approx(online, abs=1e-6)
    finally:
        server.stop()
    assert len(hub.requests) == asked


def serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "server.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_network_or_cache_the_start_stops_in_one_line_saying_how_to_fetch_it(
    hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens at this endpoint: the hub cannot be reached, and the cache is empty.
    with serving(FakeHub({})) as gone:
        pass
    monkeypatch.setenv("HF_ENDPOINT", gone)
    finished = serve("--model", "org/tiny@v1")
    assert finished.returncode == 2
    assert finished.stderr.count("\n") == 1, finished.stderr
    assert finished.stderr.startswith("server.py: error: --model org/tiny@v1: ")
    assert "the hub cannot be reached" in finished.stderr
    assert '"hf download org/tiny --revision v1 --local-dir DIR", then serve --model DIR' in (
        finished.stderr
    )
    assert gone not in finished.stderr  # no address in an error line

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    finished = serve("--model", "org/tiny")
    assert finished.returncode == 2
    assert finished.stderr.count("\n") == 1, finished.stderr
    assert "HF_HUB_OFFLINE=1 is set" in finished.stderr
    assert '"hf download org/tiny --local-dir DIR"' in finished.stderr


def test_a_model_or_revision_the_hub_does_not_have_is_named_in_one_line(
    endpoint: str, hub_home: Path
) -> None:
    finished = serve("--model", "org/missing")
    assert finished.returncode == 2
    assert finished.stderr.count("\n") == 1, finished.stderr
    assert "the hub has no model org/missing" in finished.stderr
    assert "HF_TOKEN" in finished.stderr
    finished = serve("--model", "org/tiny@v9")
    assert finished.returncode == 2
    assert "the hub has org/tiny but no revision v9" in finished.stderr


def test_a_local_folder_of_the_same_spelling_wins_over_the_hub(
    hub: FakeHub, endpoint: str, hub_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tiny.sentence_folder(tmp_path / "work" / "org", "tiny")
    monkeypatch.chdir(tmp_path / "work")
    source = ModelSource.parse("org/tiny")
    assert source.hub is None
    assert source.location == str(local.resolve())
    assert source.default_name == "tiny"
    assert hub.requests == []


def test_a_repository_source_may_be_a_hub_id(
    hub: FakeHub, endpoint: str, hub_home: Path, tmp_path: Path
) -> None:
    fetch(HubId("org/tiny"), offline=False)  # into the cache; the repository reads it offline
    (tmp_path / "models.toml").write_text(
        '[models.small]\nsource = "org/tiny"\n[models.pinned]\nsource = "org/tiny@main"\n'
    )
    small, pinned = load_repository(str(tmp_path / "models.toml"))
    for config in (small, pinned):
        source = config.model_source
        assert source.kind == "sentence-transformers"
        assert source.hub is not None and source.hub[1].commit == COMMIT
        assert json.loads((Path(source.location or "") / "modules.json").read_text())
