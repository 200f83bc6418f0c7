"""Your own model, as docs/models.md shows it: examples/mypackage, run from your own project folder
with ``python /path/to/server.py``, is found, reports platform ``python`` and answers tensors
of the shape its metadata declares."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from batching import ModelConfig, create_app
from batching.runtime.warmup import platform_of
from tests.support.asgi import serving
from tests.support.models import EchoModel
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """``examples/mypackage/models.py``, which docs/models.md includes."""
    assert '--8<-- "examples/mypackage/models.py"' in (ROOT / "docs" / "models.md").read_text()
    return (ROOT / "examples" / "mypackage" / "models.py").read_text()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder holding the docs' example package, outside this clone."""
    package = tmp_path / "my-project" / "mypackage"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(readme_example())
    return package.parent


@pytest.mark.slow
def test_the_readme_example_runs_from_its_own_folder_and_agrees_with_its_metadata(
    project: Path,
) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "server.py"), "--model", "mypackage.models:Reverser"]
        + ["--port", str(port), "--grpc-port", "0"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, server.communicate()[0]
                try:
                    if client.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "never became ready"
                time.sleep(0.05)  # polling a subprocess's readiness, with a deadline
            metadata = client.get("/v2/models/Reverser").json()
            texts = ["abc", "hello"]
            answer = client.post(
                "/v2/models/Reverser/infer",
                json={
                    "inputs": [
                        {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": texts}
                    ]
                },
            ).json()
            plain = client.post("/models/Reverser", content=b"abc").json()
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert metadata["platform"] == "python"
    # What the class declares is what the server describes and what it answers.
    sys.path.insert(0, str(project))
    try:
        from mypackage.models import Reverser  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("mypackage.models", None)
        sys.modules.pop("mypackage", None)
    declared: dict[str, Any] = Reverser().metadata()
    assert [tensor["shape"] for tensor in metadata["outputs"]] == [
        tensor["shape"] for tensor in declared["outputs"]
    ]
    assert [tensor["shape"] for tensor in metadata["inputs"]] == [
        tensor["shape"] for tensor in declared["inputs"]
    ]
    (output,) = answer["outputs"]
    assert output["name"] == "reversed"
    assert output["shape"] == [len(texts), *declared["outputs"][0]["shape"][1:]] == [2, 1]
    assert output["data"] == ["cba", "olleh"]
    assert plain["outputs"] == ["cba"]


class DeclaresItsPlatform(EchoModel):
    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "platform": "onnxruntime_onnx"}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("model", "platform"), [(EchoModel(), "python"), (DeclaresItsPlatform(), "onnxruntime_onnx")]
)
async def test_a_custom_model_reports_platform_python_unless_it_says_otherwise(
    model: Any, platform: str
) -> None:
    config = ModelConfig(name="mine", source="tests.support.models:EchoModel")
    async with serving(create_app(config, builder=lambda _: model)) as client:
        described = (await client.get("/v2/models/mine")).json()
        configured = (await client.get("/v2/models/mine/config")).json()
    assert described["platform"] == configured["platform"] == platform


def test_the_packaged_models_report_pytorch() -> None:
    from batching.models.embedding.sentence import SentenceEmbedder

    assert platform_of(SentenceEmbedder.__new__(SentenceEmbedder), {}) == "pytorch"
    assert platform_of(EchoModel(), {}) == "python"
