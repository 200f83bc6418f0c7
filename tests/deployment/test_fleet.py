"""The local replica fleet behind HAProxy (``deploy/haproxy/run.sh``), on real processes.

Needs HAProxy (``apt-get install -y haproxy``; ``.ci/run`` installs it): without it these
tests fail with that instruction, they never skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support.fleet import RUN_SH, Fleet, checked_status
from tests.support.metrics import sample
from tests.support.tls import make_pki

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FLAGS = ["--model", "tests.support.models:CostModel", "--max-batch-size", "8"]
ENV = {"COST_MODEL_A_MS": "5", "COST_MODEL_B_MS": "0.5"}


def served_by(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    return sample(metrics, "batching_requests_total", 0.0, model="CostModel", code="200")


def test_a_server_haproxy_lists_as_up_before_any_check_passed_is_not_ready() -> None:
    # HAProxy lists a server UP from its start, before its first check: a fleet waiting for
    # UP must not take that for a replica that answers.
    assert checked_status({"status": "UP", "check_status": "INI"}) == "UNCHECKED (UP)"
    assert checked_status({"status": "UP", "check_status": ""}) == "UNCHECKED (UP)"
    assert checked_status({"status": "UP", "check_status": "L7OK"}) == "UP"
    assert checked_status({"status": "UP", "check_status": "* L7OK"}) == "UP"
    assert checked_status({"status": "DOWN", "check_status": "L4CON"}) == "DOWN"


def test_sigkill_of_one_replica_under_steady_load_fails_no_request_and_it_comes_back(
    tmp_path: Path,
) -> None:
    with Fleet(2, FLAGS, tmp_path, env=ENV) as fleet:
        victim = fleet.replica_pid(1)
        statuses: list[int] = []
        wrong: list[str] = []

        async def load(stop: asyncio.Event) -> None:
            async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:

                async def one_client(index: int) -> None:
                    sent = 0
                    while not stop.is_set():
                        text = f"c{index}-{sent}"
                        try:
                            response = await client.post("/", content=text.encode())
                        except httpx.HTTPError as exc:
                            wrong.append(f"{text}: {exc!r}")
                            statuses.append(-1)
                            continue
                        finally:
                            sent += 1
                        statuses.append(response.status_code)
                        if response.status_code != 200:
                            wrong.append(f"{text}: {response.status_code} {response.text}")
                        elif response.json()["outputs"] != [{"input": text, "length": len(text)}]:
                            wrong.append(f"{text}: {response.text}")

                await asyncio.gather(*(one_client(i) for i in range(8)))

        async def scenario() -> None:
            stop = asyncio.Event()
            clients = asyncio.create_task(load(stop))
            try:
                await wait_for(lambda: len(statuses) >= 200, "the load to reach 200 requests")
                os.kill(victim, signal.SIGKILL)
                killed_at = len(statuses)
                # run.sh restarts it, and HAProxy's checks bring it back into rotation.
                await wait_for(
                    lambda: fleet.replica_pid(1) != victim, "run.sh to restart replica 1"
                )
                await asyncio.to_thread(fleet.wait_until, {"r1": "DOWN"}, 30)
                await asyncio.to_thread(fleet.wait_until, {"r1": "UP", "r2": "UP"}, 90)
                # Back in rotation: the new process serves part of the steady load.
                await wait_for(
                    lambda: served_by(fleet.replica_url(1)) >= 50,
                    "the restarted replica to serve 50 requests",
                )
                assert len(statuses) > killed_at
            finally:
                stop.set()
                await clients

        asyncio.run(scenario())
        assert wrong == [], wrong[:10]
        assert len(statuses) >= 300
        assert served_by(fleet.replica_url(2)) > 0
        returncode = fleet.stop()
    assert returncode == 0, fleet.log()
    for index in (1, 2):
        with pytest.raises(ProcessLookupError):
            os.kill(fleet.replica_pid(index), 0)


async def wait_for(condition: object, what: str, within: float = 90.0) -> None:
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if await asyncio.to_thread(condition):
            return
        await asyncio.sleep(0.05)  # polling the fleet's state, with a deadline
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_stops_haproxy_and_every_replica(tmp_path: Path) -> None:
    with Fleet(2, FLAGS, tmp_path, env=ENV) as fleet:
        response = httpx.post(fleet.url, content=b"hello", timeout=10)
        assert response.json()["outputs"] == [{"input": "hello", "length": 5}]
        pids = [fleet.replica_pid(1), fleet.replica_pid(2)]
        haproxy = int((tmp_path / "haproxy.pid").read_text())
        assert fleet.stop() == 0, fleet.log()
    for pid in [*pids, haproxy]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "run.sh: stopped" in (tmp_path / "run.out").read_text()


def test_tls_pem_serves_https_on_the_front_port_to_curl(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    front = tmp_path / "front.pem"
    front.write_bytes(pki.server.cert + pki.server.key)
    with Fleet(1, FLAGS, tmp_path / "run", env=ENV, tls_pem=front) as fleet:
        assert fleet.url.startswith("https://")
        curl = ["curl", "-sS", "--max-time", "10", "--cacert", str(pki.ca)]
        answered = subprocess.run(
            [*curl, "--data-binary", "hello", f"{fleet.url}/"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert answered.returncode == 0, answered.stderr
        assert json.loads(answered.stdout)["outputs"] == [{"input": "hello", "length": 5}]
        # The certificate is HAProxy's: a client that does not trust its CA is refused, and
        # plain HTTP on the port gets no answer from a replica.
        untrusted = subprocess.run(
            ["curl", "-sS", "--max-time", "10", f"{fleet.url}/v2/health/ready"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert untrusted.returncode == 60, untrusted.stderr  # peer certificate not verified
        plain = subprocess.run(
            ["curl", "-sS", "--max-time", "10", f"http://127.0.0.1:{fleet.port}/v2/health/ready"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert '"ready"' not in plain.stdout
        assert fleet.stop() == 0, fleet.log()


def test_replica_tls_flags_are_refused_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(RUN_SH), "--replicas", "1", "--port", "8000", "--", "--ssl-certfile", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "run.sh: --ssl-certfile: the replicas serve plain HTTP on 127.0.0.1 behind HAProxy; "
        "give HAProxy the certificate with --tls-pem"
    ]
