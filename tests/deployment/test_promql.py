"""The PromQL in the Kubernetes manifests, run by a real Prometheus (Debian's 2.42 package)
scraping a real local fleet (``deploy/haproxy/run.sh``), 127.0.0.1 only.

Needs ``prometheus`` and ``haproxy`` (``apt-get install -y prometheus haproxy``; ``.ci/run``
installs them): without them these tests fail with that instruction, they never skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fleet import Fleet
from tests.support.manifests import NAMESPACE, promql_queries
from tests.support.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FLAGS = ["--model", "tests.support.models:CostModel", "--max-batch-size", "8"]


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise AssertionError(
            "Prometheus is not installed: `apt-get install -y prometheus` (.ci/run does it)"
        )
    return found


def scrape_config(fleet: Fleet) -> str:
    # The labels a Kubernetes pod scrape carries, so the manifests' queries run unchanged.
    targets = [
        {
            "targets": [f"127.0.0.1:{fleet.port + index}"],
            "labels": {"namespace": NAMESPACE, "pod": f"batching-{index}"},
        }
        for index in range(1, fleet.replicas + 1)
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "batching", "static_configs": targets}],
    }
    return json.dumps(config)  # JSON is YAML


def test_every_query_in_the_manifests_returns_a_vector_from_the_local_fleet(
    tmp_path: Path,
) -> None:
    binary = prometheus_binary()
    queries = promql_queries()
    assert queries
    with Fleet(2, FLAGS, tmp_path / "fleet") as fleet:
        (tmp_path / "prometheus.yml").write_text(scrape_config(fleet))
        port = free_port()
        with open(tmp_path / "prometheus.log", "wb") as log:
            prometheus = subprocess.Popen(
                [
                    binary,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            for _ in range(2):  # a little traffic, so the series are not only idle zeros
                httpx.post(fleet.url, content=b"warm", timeout=10).raise_for_status()
            up = wait_for_vector(api, "up == 1", prometheus, tmp_path, length=2)
            assert {sample["metric"]["pod"] for sample in up} == {"batching-1", "batching-2"}
            for query in queries:
                vector = wait_for_vector(api, query, prometheus, tmp_path)
                print(f"{query}\n  -> {[sample['value'][1] for sample in vector]}")
                for sample in vector:
                    assert float(sample["value"][1]) >= 0
        finally:
            prometheus.terminate()
            prometheus.wait(30)


def wait_for_vector(
    api: str,
    query: str,
    prometheus: subprocess.Popen[bytes],
    tmp_path: Path,
    length: int = 1,
) -> list[dict[str, object]]:
    """Poll ``/api/v1/query`` until ``query`` returns a vector of at least ``length``."""
    last: object = None
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if prometheus.poll() is not None:
                raise AssertionError((tmp_path / "prometheus.log").read_text()[-3000:])
            try:
                response = client.get(f"{api}/query", params={"query": query})
            except httpx.TransportError as exc:
                last = exc
            else:
                if response.status_code == 503:
                    # Prometheus answers "Service Unavailable" until its storage is ready.
                    last = response.text
                    time.sleep(0.2)  # polling Prometheus' API until it is ready
                    continue
                answer = response.json()
                last = answer
                assert answer["status"] == "success", answer
                assert answer["data"]["resultType"] == "vector", answer
                result: list[dict[str, object]] = answer["data"]["result"]
                if len(result) >= length:
                    return result
            time.sleep(0.2)  # polling Prometheus' API until a scrape has landed
    raise AssertionError(f"{query!r} never returned {length} samples; last answer {last}")
