"""Where one client's request time goes: the engine's own call against the serving around it.

One client sends a sentence, waits for its vector, sends the next: every step is serial, so
the server's rate is one over the sum of the steps. This script measures, interleaved over
``--rounds`` (order rotated each round):

- **engine**: the default model's ``predict`` on one sentence at a time, in a process of its
  own, on the engine ``auto`` chose (the same engine cache as the server): what the request's
  model step costs with nothing around it;
- **server**: ``python server.py`` on the default model, one client (this process's light
  keep-alive client, the one ``thread_profile.py`` uses);
- **instant model**: the same server and client with a model that answers at once (the test
  suite's option embedder: same door, options, token counting, batcher and thread hand-off):
  what serving alone costs per request.

Per round it prints the milliseconds per request of each, the server's own timing of its model
step meanwhile (``/metrics``: the same ``predict``, inside the server), and what the server adds
to the engine's call; the medians close the table.

    python benchmarks/one_client.py --rounds 3 --seconds 8 --out docs/results/x.json

Run it on a quiet machine: nothing else on the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._results import finish  # noqa: E402
from benchmarks.serving import closed_loop, sentences  # noqa: E402
from load_test.metrics_scrape import fetch_metrics, parse_histograms  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402

#: The server's histogram of the model step (``predict`` on the instance's thread) per batch.
COMPUTE_METRIC = "batching_batch_compute_seconds"

#: A model with the embedding door's metadata that answers at once.
INSTANT_MODEL = "tests.support.embedder:OptionEmbedder"

#: The engine step alone, in a child process: the default model on the engine auto chose.
ENGINE_SCRIPT = """
import json, sys, time
from batching.models.embedding.sentence import SentenceEmbedder
from batching.models.engines.engine_options import EngineOptions
from benchmarks.serving import sentences
model = SentenceEmbedder(engine=EngineOptions(model_name="all-MiniLM-L6-v2"))
model.load("cpu")
texts = sentences(600)
for text in texts[:100]:
    model.predict([text])
seconds, done = float(sys.argv[1]), 0
started = time.perf_counter()
while time.perf_counter() - started < seconds:
    model.predict([texts[done % len(texts)]])
    done += 1
print(json.dumps({"items_per_s": done / (time.perf_counter() - started)}))
"""


def engine_rate(seconds: float) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(seconds)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["items_per_s"])


def compute_seconds(url: str) -> tuple[float, float]:
    """The model step's seconds and batches so far, summed over the server's models."""
    text = fetch_metrics(f"{url}/metrics")
    if text is None:
        raise RuntimeError(f"no /metrics at {url}")
    series = parse_histograms(text, COMPUTE_METRIC).values()
    return sum(h.sum for h in series), sum(h.count for h in series)


def served_rate(server_args: list[str], seconds: float, label: str) -> tuple[float, float]:
    """Items/s of one client, and the model step's milliseconds per batch meanwhile."""
    log = ROOT / "load_test_results" / f"one-client-{label}.log"
    env = {"PYTHONPATH": str(ROOT)}
    with ServerProcess(server_args, cwd=ROOT, log_path=log, env=env) as server:
        texts = sentences(600)
        asyncio.run(closed_loop(server.port, 1, 2.0, texts))
        spent, batches = compute_seconds(server.url)
        result = asyncio.run(closed_loop(server.port, 1, seconds, texts))
        spent_after, batches_after = compute_seconds(server.url)
    step_ms = 1000.0 * (spent_after - spent) / max(1.0, batches_after - batches)
    return float(result["items_per_s"]), step_ms


def run(args: argparse.Namespace) -> dict[str, Any]:
    steps: dict[str, Callable[[], tuple[float, float]]] = {
        "engine": lambda: (engine_rate(args.seconds), 0.0),
        "server": lambda: served_rate(["--grpc-port", "0"], args.seconds, "server"),
        "instant": lambda: served_rate(
            ["--grpc-port", "0", "--model", INSTANT_MODEL], args.seconds, "instant"
        ),
    }
    names = list(steps)
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        measured = {name: steps[name]() for name in order}
        rates = {name: rate for name, (rate, _) in measured.items()}
        ms = {name: 1000.0 / rate for name, rate in rates.items()}
        step_ms = measured["server"][1]
        row = {
            "round": index + 1,
            "order": order,
            "items_per_s": {name: round(rate, 1) for name, rate in rates.items()},
            "ms_per_request": {name: round(value, 3) for name, value in ms.items()},
            "server_model_step_ms": round(step_ms, 3),
            "server_adds_ms": round(ms["server"] - ms["engine"], 3),
            "server_vs_engine": round(rates["server"] / rates["engine"], 3),
        }
        rounds.append(row)
        print(json.dumps(row), flush=True)

    def median(pick: Callable[[dict[str, Any]], float]) -> float:
        return round(statistics.median(pick(row) for row in rounds), 3)

    return {
        "command": " ".join(["python", "benchmarks/one_client.py", *sys.argv[1:]]),
        "rounds": rounds,
        "median": {
            **{name: median(lambda row, n=name: row["ms_per_request"][n]) for name in names},
            "server_model_step_ms": median(lambda row: row["server_model_step_ms"]),
            "server_adds_ms": median(lambda row: row["server_adds_ms"]),
            "server_vs_engine": median(lambda row: row["server_vs_engine"]),
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| round | engine alone | server | its model step | server adds | instant model served "
        "| server / engine |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rounds"]:
        ms = row["ms_per_request"]
        lines.append(
            f"| {row['round']} | {ms['engine']:.2f} ms | {ms['server']:.2f} ms "
            f"| {row['server_model_step_ms']:.2f} ms | {row['server_adds_ms']:.2f} ms "
            f"| {ms['instant']:.2f} ms "
            f"| {row['server_vs_engine']:.2f} |"
        )
    m = result["median"]
    lines.append(
        f"| median | {m['engine']:.2f} ms | {m['server']:.2f} ms "
        f"| {m['server_model_step_ms']:.2f} ms | {m['server_adds_ms']:.2f} ms "
        f"| {m['instant']:.2f} ms | **{m['server_vs_engine']:.2f}** |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=None, help="write the rounds here (JSON)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    result = run(args)
    return finish(result, table(result), args.out)


if __name__ == "__main__":
    sys.exit(main())
