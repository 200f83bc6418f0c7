"""Models for process instances.

A process instance builds its model in a spawned child, which imports the model's module by
name: these classes must live in an importable module, not inside a test function. Tests
steer them through their inputs, and observe them through their outputs and through files
in a directory the test names (processes share no memory with the test).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Longest a model waits for a file the test should create; a bound, never the expected path.
WAIT_BOUND_S = 20.0
_POLL_S = 0.002


def _wait_for(condition: Any) -> bool:
    deadline = time.monotonic() + WAIT_BOUND_S
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(_POLL_S)  # another process's file has no event to wait on
    return False


class PidModel:
    """Answers each input with the process, device and instance that computed it.

    Special inputs:

    - ``"fail"``: raises ``ValueError``, an ordinary model error;
    - ``"exit"``: raises ``SystemExit``, which ends the instance;
    - ``"unpicklable"``: answers an object that cannot be sent back to the server;
    - ``"hold:DIR"``: creates ``DIR/entered-PID``, then waits for ``DIR/release``;
    - ``"meet:DIR"``: creates ``DIR/met-PID``, then waits until two ``met-*`` files exist
      and answers whether they did: two instances inside ``predict`` at the same time.
    """

    def __init__(self) -> None:
        self.device = ""
        self.index = -1

    def load(self, device: str, instance_index: int = 0) -> None:
        self.device = device
        self.index = instance_index

    def predict(self, inputs: list[Any]) -> Sequence[Any]:
        outputs: list[Any] = []
        for item in inputs:
            outputs.append(self._answer(str(item)))
        return outputs

    def _answer(self, item: str) -> Any:
        answer: dict[str, Any] = {
            "input": item,
            "pid": os.getpid(),
            "device": self.device,
            "index": self.index,
        }
        if item == "fail":
            raise ValueError("this model refuses 'fail'")
        if item == "exit":
            raise SystemExit("the instance process exits")
        if item == "unpicklable":
            return lambda: None
        if item.startswith("hold:"):
            folder = Path(item.removeprefix("hold:"))
            (folder / f"entered-{os.getpid()}").touch()
            answer["released"] = _wait_for((folder / "release").exists)
        if item.startswith("meet:"):
            folder = Path(item.removeprefix("meet:"))
            (folder / f"met-{os.getpid()}").touch()
            answer["met"] = _wait_for(lambda: len(list(folder.glob("met-*"))) >= 2)
        return answer

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "answer", "datatype": "BYTES", "shape": [-1]}],
        }
