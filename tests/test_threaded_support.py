"""The test suite's in-thread server (tests.support.threaded): a model whose load fails ends
the wait for readiness at once, with the repository index's reason, instead of waiting out the
timeout (the app keeps serving: only ``server.py`` exits on a failed start)."""

from __future__ import annotations

import pytest

from batching import ModelConfig, create_app
from tests.support.threaded import serving_in_thread


def test_a_failed_load_ends_the_wait_for_readiness_at_once() -> None:
    """Its wait is given 600 s, beyond the suite's limit per test: only the early failure
    lets this test pass."""
    app = create_app(ModelConfig(name="broken", source="tests.support.stuck:Fails"))
    with (
        pytest.raises(AssertionError, match="a model failed to load.*broken.*OSError"),
        serving_in_thread(app, timeout=600),
    ):
        pass
