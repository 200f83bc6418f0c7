"""What a model costs in memory, shown per model, and a second copy of the same model (the
packaged embedder under two names, as an operator serves it with two configurations) costing
no more than its weights once more: the copies share their engine runners. Resident memory of
two real servers, one copy and two, after the same requests."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from batching.models.default import default_model_path
from tests.support.metrics import sample
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.slow

TEXTS = {"inputs": ["a cat sat on the mat", "two dogs ran", "a long sentence " * 20]}


def serve_copies(root: Path, copies: int) -> tuple[int, dict[str, dict[str, float]], str]:
    """Serve ``copies`` copies of the packaged model; each answers the same requests. The
    server's resident bytes then, its repository index by name, and its metrics."""
    repository = root / f"copies-{copies}"
    for number in range(copies):
        folder = repository / f"copy{number}"
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text('source = "default"\n')
    server = ServerProcess(model=["--model-repository", str(repository)], ready_s=110)
    try:
        outputs = []
        for number in range(copies):
            for _ in range(20):
                answer = httpx.post(f"{server.url}/models/copy{number}", json=TEXTS, timeout=30)
                assert answer.status_code == 200, answer.text
            outputs.append(answer.json()["outputs"])
        assert all(output == outputs[0] for output in outputs)  # shared, still the same
        resident = psutil.Process(server.process.pid).memory_info().rss
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        return resident, index, httpx.get(f"{server.url}/metrics").text
    finally:
        server.stop()


def test_a_second_copy_of_a_model_costs_no_more_than_its_weights_once_more(
    tmp_path: Path,
) -> None:
    weights = (Path(default_model_path()) / "model.safetensors").stat().st_size
    one, _, _ = serve_copies(tmp_path, 1)
    two, index, metrics = serve_copies(tmp_path, 2)
    assert two - one <= weights, f"a second copy cost {(two - one) / 2**20:.0f} MB"
    for name in ("copy0", "copy1"):
        assert index[name]["memory_mb"] >= 0
        shown = sample(metrics, "batching_model_memory_bytes", model=name)
        assert shown == pytest.approx(index[name]["memory_mb"] * 2**20, abs=2**20)
