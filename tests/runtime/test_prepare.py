"""``python server.py --prepare`` fills the engine cache and exits 0; a server started on that
cache serves from it without importing torch or transformers (tokenised by the folder's
tokenizer.json, pooled in numpy), with the same vectors as torch; a model that cannot be
prepared exits 1 with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from batching.models.embedding.sentence import SentenceEmbedder
from load_test.serverproc import free_port
from tests.support.tiny import sentence_folder

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["the cat sat on the mat", "a dog", "what where who eats fish and sleeps very fast"]

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("prepare")
    folder = sentence_folder(root)
    cache = root / "engines"
    done = subprocess.run(
        [
            *(sys.executable, "server.py", "--prepare", "--model", str(folder)),
            *("--engine", "onnxruntime", "--engine-cache", str(cache)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return folder, cache, done.stderr if done.returncode == 0 else f"exit {done.returncode}"


def test_prepare_writes_the_export_the_decision_and_the_calibration(
    prepared: tuple[Path, Path, str],
) -> None:
    _, cache, log = prepared
    assert not log.startswith("exit"), log
    (model,) = [path for path in cache.iterdir() if path.is_dir()]
    assert (model / "onnx" / "model.onnx").is_file()
    (decision,) = (model / "decisions").iterdir()
    saved = json.loads(decision.read_text())
    assert saved["decision"]["routes"][0]["engine"] == "onnxruntime"
    assert saved["tokenizer_json_differs"] is None  # checked against transformers
    assert "busy_cores" in saved["decision"]
    assert list((model / "calibration").glob("*.npy"))
    assert "prepare: done" in log
    # Progress is in the log, the child's lines included.
    assert "checking onnxruntime-fp32 against torch fp32" in log


@pytest.fixture(scope="module")
def server(prepared: tuple[Path, Path, str]) -> Iterator[tuple[str, int]]:
    folder, cache, _ = prepared
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "server.py", "--model", str(folder), "--engine", "onnxruntime"),
            *("--engine-cache", str(cache), "--port", str(port), "--grpc-port", "0"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)  # polling another process's readiness: no event to wait on
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(30)


def test_a_server_on_the_prepared_cache_never_loads_torch(
    prepared: tuple[Path, Path, str], server: tuple[str, int]
) -> None:
    folder, _, _ = prepared
    url, pid = server
    answer = httpx.post(url, json={"inputs": TEXTS}, timeout=30)
    tokens = httpx.post(f"{url}/tokenize", json={"inputs": "the cat"}, timeout=30)
    assert answer.status_code == 200 and tokens.status_code == 200
    metadata = httpx.get(f"{url}/v2/models/{folder.name}", timeout=30).json()
    assert metadata["engine"]["reused_from_cache"] is True
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libtorch" not in maps and "/torch/" not in maps
    reference = SentenceEmbedder(folder)
    reference.load("cpu")
    np.testing.assert_allclose(
        np.array(answer.json()["outputs"], dtype=np.float32), reference.predict(TEXTS), atol=1e-5
    )


def test_a_model_that_cannot_be_prepared_exits_1_with_one_line(tmp_path: Path) -> None:
    folder = sentence_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"not weights")
    done = subprocess.run(
        [
            *(sys.executable, "server.py", "--prepare", "--model", str(folder)),
            *("--engine", "onnxruntime", "--engine-cache", str(tmp_path / "engines")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "BATCHING_LOG_LEVEL": "error"},
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("server.py: error")]
    assert len(errors) == 1 and "cannot be prepared" in errors[0]
