"""``python -m load_test soak``: a short smoke run of every client kind against the fake."""

from __future__ import annotations

import json
import os
from pathlib import Path

from load_test.__main__ import main
from load_test.soak import Mix, run_soak, summary
from tests.loadtest.helpers import assert_png
from tests.support.fake_server import FakeSettings, serve

KINDS = {"small", "big", "mixed", "retry", "polite"}


def test_a_short_soak_of_every_client_kind_reports_each_window() -> None:
    settings = FakeSettings(failures={3: 503}, failure_period=4)
    duration = 1.2
    with serve(settings) as (url, _):
        while True:
            result = run_soak(
                url,
                Mix(small=2, big=1, mixed=1, retry=2, polite=1, slow=3, idle=3, big_items=64),
                duration=duration,
                window=duration / 3,
                server_pid=os.getpid(),
            )
            figures = summary(result)
            # Until every kind was answered (a busy machine schedules some clients late):
            # a state, not a time budget; pytest's timeout bounds it.
            if KINDS <= set(figures["kinds"]) and figures["kinds"]["retry"]["refused"] > 0:
                break
            duration *= 2
    assert KINDS <= set(figures["kinds"])
    assert figures["kinds"]["retry"]["refused"] > 0  # every fourth arrival is a 503
    assert figures["kinds"]["big"]["ok"] > 0
    assert len(result.windows) >= 3
    window = result.windows[-1]
    assert window["rss_mb"] > 0 and window["fds"] > 0
    assert "goodput_per_s" in window


def test_the_soak_command_writes_json_and_a_plot(tmp_path: Path) -> None:
    with serve(FakeSettings()) as (url, _):
        code = main(
            [
                "soak",
                "--url",
                url,
                "--server-pid",
                str(os.getpid()),
                "-d",
                "1",
                "--window",
                "0.5",
                "--small",
                "2",
                "--big",
                "1",
                "--big-items",
                "16",
                "--idle",
                "2",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert code == 0
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert doc["summary"]["kinds"]["small"]["ok"] > 0
    assert doc["windows"]
    assert_png(tmp_path / "soak.png")
