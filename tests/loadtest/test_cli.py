"""``python -m load_test`` (``load_test.__main__``): the commands end to end against the fake
server, in-process."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from load_test.__main__ import main
from tests.loadtest.helpers import ROOT, assert_png
from tests.support.fake_server import FakeSettings, serve


def _run(args: list[str]) -> int:
    return main(["run", "--no-progress", *args])


def test_run_closed_loop_reports_outcomes_items_and_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = FakeSettings(failures={3: 503, 7: 504})
    with serve(settings) as (url, fake):
        code = _run(
            ["--url", url, "-c", "4", "-n", "100", "--items", "1-6", "--out-dir", str(tmp_path)]
        )
        ok_batches = list(fake.batches)
    assert code == 0
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    summary = doc["summary"]
    assert summary["requests"] == 100
    outcomes = summary["outcomes"]
    assert (outcomes["200"], outcomes["503"], outcomes["504"]) == (80, 10, 10)
    assert outcomes["connection_errors"] == outcomes["timeouts"] == 0
    assert outcomes["other_http"] == {}
    # The tool's count of items answered agrees with what the server computed...
    assert summary["ok_items"] == sum(ok_batches)
    # ...and with the batch histogram it scraped from /metrics.
    batches = doc["server_batches"]['model="fake"']
    assert batches["batches"] == 80
    assert batches["items"] == summary["ok_items"]
    assert summary["latency"]["count"] == 80
    assert summary["throughput"]["requests_per_s"] > 0
    assert doc["load"]["concurrency"] == 4
    assert doc["client"]["connections_opened"] == 4
    for name in ("latency.png", "timeline.png"):
        assert_png(tmp_path / name)
    printed = capsys.readouterr().out
    assert "503: 10" in printed and "504: 10" in printed


def test_run_open_loop_steps_over_v2_with_a_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(FakeSettings(model_name="all-MiniLM-L6-v2")) as (url, _):
        code = main(
            [
                "run",
                "--url",
                url,
                "--api",
                "v2",
                "--steps",
                "100,200",
                "--step-duration",
                "0.3",
                "--arrival",
                "fixed",
                "--items",
                "2",
                "--progress",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert code == 0
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    assert doc["summary"]["requests"] == 90
    assert doc["summary"]["outcomes"]["200"] == 90
    assert doc["summary"]["ok_items"] == 180
    assert [p["requests"] for p in doc["phases"]] == [30, 60]
    assert [p["offered_rate"] for p in doc["phases"]] == [100, 200]
    assert doc["client"]["send_lag"]["count"] == 90
    assert doc["client"]["offered_requests_per_s"] == pytest.approx(150, rel=0.2)
    for name in ("latency.png", "timeline.png", "rates.png"):
        assert_png(tmp_path / name)
    assert "req" in capsys.readouterr().err  # the bar drew on stderr


def test_run_open_loop_ramp_sends_the_ramps_arrivals(tmp_path: Path) -> None:
    with serve(FakeSettings()) as (url, fake):
        args = ["--url", url, "--ramp", "50:150", "-d", "0.5", "--arrival", "fixed"]
        assert _run([*args, "--no-plots", "--out-dir", str(tmp_path)]) == 0
        served = fake.arrivals
    doc = orjson.loads((tmp_path / "result.json").read_bytes())
    # Expected arrivals: the area under the ramp, (50 + 150) / 2 * 0.5 s.
    assert doc["summary"]["requests"] == served == 50
    assert doc["load"]["segments"] == [{"start_rate": 50, "end_rate": 150, "duration_s": 0.5}]


def test_concurrency_sweep_writes_a_point_per_level(tmp_path: Path) -> None:
    with serve(FakeSettings()) as (url, _):
        code = main(
            [
                "concurrency-sweep",
                "--url",
                url,
                "--levels",
                "1,4",
                "-n",
                "40",
                "--items",
                "1-3",
                "--warmup",
                "4",
                "--no-progress",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert code == 0
    doc = orjson.loads((tmp_path / "sweep.json").read_bytes())
    assert [p["x"] for p in doc["points"]] == [1, 4]
    assert [r["summary"]["requests"] for r in doc["runs"]] == [40, 40]
    assert all(p["mean_batch"] is not None for p in doc["points"])
    assert "| clients |" in doc["table_markdown"]
    assert_png(tmp_path / "sweep.png")


def test_httpx_client_counts_alike(tmp_path: Path) -> None:
    with serve(FakeSettings(failures={1: 503})) as (url, _):
        args = ["--url", url, "-c", "3", "-n", "30", "--http-client", "httpx", "--no-plots"]
        assert _run([*args, "--out-dir", str(tmp_path)]) == 0
    outcomes = orjson.loads((tmp_path / "result.json").read_bytes())["summary"]["outcomes"]
    assert (outcomes["200"], outcomes["503"]) == (27, 3)


def test_v2_run_naming_an_unknown_model_stops_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(FakeSettings(model_name="served")) as (url, fake):
        with pytest.raises(SystemExit) as exit_info:
            _run(["--url", url, "--api", "v2", "-n", "5", "--out-dir", str(tmp_path)])
        assert fake.arrivals == 0
    assert exit_info.value.code == 2
    assert "--model-name" in capsys.readouterr().err


def test_a_run_counts_connection_errors_when_the_server_goes_away() -> None:
    # The command refuses to start against nothing (tests/loadtest/test_first_run.py); a
    # server that goes away during a run is counted, request by request.
    from load_test.client import LoadSpec, Target
    from load_test.measure import measure
    from load_test.payloads import build_payloads
    from load_test.serverproc import free_port

    target = Target.parse(f"http://127.0.0.1:{free_port()}")
    spec = LoadSpec(payloads=build_payloads(api="json", items=(1, 1)), concurrency=2, requests=10)
    doc = measure(target, spec, progress=False).doc
    assert doc["summary"]["outcomes"]["connection_errors"] == 10
    assert doc["summary"]["outcomes"]["error_kinds"] == {"ConnectionRefusedError": 10}
    assert doc["server_batches"] is None


def test_cli_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "concurrency-sweep", "triton-batching", "tune"):
        assert command in out


def test_cli_rejects_contradictory_loads() -> None:
    # A usage error (argparse's exit status 2), not a run that failed.
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--concurrency", "4", "--rate", "10"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--api", "plain", "--items", "2", "--no-progress"])
    assert exit_info.value.code == 2


def test_package_runs_as_a_module() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "load_test", "tune", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "--p99-ms" in done.stdout
