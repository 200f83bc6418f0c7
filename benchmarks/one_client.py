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
  what serving alone costs per request;
- **app**: the instant model's app in a process of its own, driven through its ASGI callable
  one request at a time, no HTTP and no client: what the app itself costs (the door, the data
  plane, the batcher, the hand-off to the instance's thread and back), its CPU per request,
  and the event loop's Python function calls per request (cProfile's count over 500 more
  requests: the same on any machine, busy or not); then two parts of its path, each alone:
  its middleware and routing (the liveness route, which answers without the data plane) and
  the instance thread's hand-off and back (an empty call);
- **uvicorn**: bare uvicorn (its own HTTP protocol and event loop, as ``server.py`` picks
  them) with an ASGI app of a few lines that reads the body and answers the instant model's
  JSON, the same client: the floor, what the HTTP exchange itself costs. ``instant / uvicorn``
  is what serving costs as a multiple of it.

Per round it prints the milliseconds per request of each, the server's own timing of its model
step meanwhile (``/metrics``: the same ``predict``, inside the server), what the server adds
to the engine's call, and each server's CPU time per request (all its threads: on a shared
machine the steadier figure); the medians close the table.

    python benchmarks/one_client.py --rounds 3 --seconds 8 --out docs/results/x.json
    python benchmarks/one_client.py --steps instant,uvicorn --rounds 3 --seconds 4
    # this checkout against another (an export of an older commit), in turn
    python benchmarks/one_client.py --steps instant,uvicorn,app --compare-dir ../before

Run it on a quiet machine: nothing else on the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

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


#: The instant model's app driven in a process of its own through its ASGI callable, one
#: request at a time on uvloop, no HTTP: what the app itself costs (the door, the data plane,
#: the batcher and the hand-off to the instance's thread and back), all its threads' CPU.
APP_SCRIPT = """
import asyncio, cProfile, json, pstats, sys, time
import uvloop
from batching import ModelConfig, create_app
from batching.runtime.worker import InstanceThread
from benchmarks.serving import sentences

async def main(seconds):
    app = create_app(ModelConfig(name="OptionEmbedder", source=sys.argv[2]))
    bodies = [text.encode() for text in sentences(600)]

    async def call(method, path, body=b""):
        never = asyncio.get_running_loop().create_future()  # the client never hangs up
        headers = [(b"host", b"127.0.0.1"), (b"content-type", b"text/plain"),
                   (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "headers": headers,
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
        read = False
        async def receive():
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never
        status = []
        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
        await app(scope, receive, send)
        return status[0]

    async with app.router.lifespan_context(app):
        while await call("GET", "/v2/health/ready") != 200:
            await asyncio.sleep(0.05)
        for index in range(2000):
            assert await call("POST", "/", bodies[index % 600]) == 200
        done, cpu, started = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - started < seconds:
            assert await call("POST", "/", bodies[done % 600]) == 200
            done += 1
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        # Two parts of a request's path, each alone: the app's middleware and routing (the
        # liveness route answers without the data plane), and the instance thread's hand-off
        # and back (an empty call on an instance thread of its own).
        started = time.perf_counter()
        for _ in range(2000):
            await call("GET", "/v2/health/live")
        stack = (time.perf_counter() - started) / 2000
        thread = InstanceThread("handoff")
        for _ in range(200):
            await thread.call_soon(int)
        started = time.perf_counter()
        for _ in range(2000):
            await thread.call_soon(int)
        handoff = (time.perf_counter() - started) / 2000
        thread.shutdown()
        profile = cProfile.Profile()
        profile.enable()
        for index in range(500):
            await call("POST", "/", bodies[index % 600])
        profile.disable()
    calls = sum(row[1] for row in pstats.Stats(profile).stats.values()) / 500
    print(json.dumps({"items_per_s": done / wall, "cpu_ms": 1000 * cpu / done, "calls": calls,
                      "stack_ms": 1000 * stack, "handoff_ms": 1000 * handoff}))

uvloop.run(main(float(sys.argv[1])))
"""


def app_rate(seconds: float, root: Path = ROOT) -> Measured:
    """The instant model's app without HTTP (:data:`APP_SCRIPT`), in a process of its own,
    from the checkout at ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", APP_SCRIPT, str(seconds), INSTANT_MODEL],
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    parts = {key: float(result[f"{key}_ms"]) for key in ("stack", "handoff")}
    return Measured(
        float(result["items_per_s"]), float(result["cpu_ms"]), calls=result["calls"], parts=parts
    )


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


@dataclass(frozen=True)
class Measured:
    """One step's figures: items/s of the client, and for a server its CPU time per request
    (every thread of its process) and the model step's milliseconds per batch (``/metrics``)."""

    items_per_s: float
    server_cpu_ms: float | None = None
    model_step_ms: float | None = None
    #: The event loop's Python function calls per request (cProfile's count; the app step).
    calls: float | None = None
    #: Milliseconds of parts of the app's path, each alone (the app step): ``stack``, its
    #: middleware and routing; ``handoff``, the instance thread's hand-off and back.
    parts: dict[str, float] | None = None


def warm(server: ServerProcess) -> None:
    """The server's first requests: 2 s of the same client."""
    asyncio.run(closed_loop(server.port, 1, 2.0, sentences(600)))


def one_client(server: ServerProcess, seconds: float) -> tuple[float, float]:
    """Items/s of one client against ``server``, and the server's CPU milliseconds per
    request meanwhile (every thread of its process)."""
    texts = sentences(600)
    process = psutil.Process(server.pid)
    before = process.cpu_times()
    started = time.monotonic()
    result = asyncio.run(closed_loop(server.port, 1, seconds, texts))
    wall = time.monotonic() - started
    after = process.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    rate = float(result["items_per_s"])
    return rate, 1000.0 * cpu / max(1.0, rate * wall)


def served_rate(server_args: list[str], seconds: float, label: str, root: Path = ROOT) -> Measured:
    """One client against ``python server.py`` of the checkout at ``root``, and the model
    step's time per batch."""
    log = ROOT / "load_test_results" / f"one-client-{label}.log"
    env = {"PYTHONPATH": str(root)}
    command = f"{{python}} {shlex.quote(str(root / 'server.py'))}"
    with ServerProcess(server_args, command=command, cwd=root, log_path=log, env=env) as server:
        warm(server)
        spent, batches = compute_seconds(server.url)
        rate, cpu_ms = one_client(server, seconds)
        spent_after, batches_after = compute_seconds(server.url)
    step_ms = 1000.0 * (spent_after - spent) / max(1.0, batches_after - batches)
    return Measured(rate, cpu_ms, step_ms)


def floor_answer() -> bytes:
    """The instant model's answer to one sentence, as the plain door encodes it."""
    from batching.codecs.plain import encode_embeddings
    from tests.support.embedder import DEFAULT_PROMPT_NAME, PROMPTS, vector_of, words_of

    text = sentences(1)[0]
    vector = vector_of(words_of(PROMPTS[DEFAULT_PROMPT_NAME], text))
    return encode_embeddings("OptionEmbedder", [vector], truncated=[True], tokens=8)


def serve_floor(host: str, port: int) -> None:
    """Bare uvicorn (its protocol and loop as ``server.py`` picks them, no access log): reads
    each request's body and answers :func:`floor_answer`; ``/v2/health/ready`` answers too."""
    import uvicorn

    answer = floor_answer()
    ready = b'{"ready":true}'

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        body = answer if scope["method"] == "POST" else ready
        headers = [(b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning", lifespan="off")


def floor_rate(seconds: float) -> Measured:
    """The same client against :func:`serve_floor`, in a process of its own."""
    log = ROOT / "load_test_results" / "one-client-uvicorn.log"
    env = {"PYTHONPATH": str(ROOT)}
    command = f"{{python}} {shlex.quote(str(Path(__file__).resolve()))} --serve-floor"
    with ServerProcess([], command=command, cwd=ROOT, log_path=log, env=env) as server:
        warm(server)
        rate, cpu_ms = one_client(server, seconds)
    return Measured(rate, cpu_ms)


#: Every step, in the order a round starts from.
STEPS = ("engine", "server", "instant", "uvicorn", "app")


def run(args: argparse.Namespace) -> dict[str, Any]:
    steps: dict[str, Callable[[], Measured]] = {
        "engine": lambda: Measured(engine_rate(args.seconds)),
        "server": lambda: served_rate(["--grpc-port", "0"], args.seconds, "server"),
        "instant": lambda: served_rate(
            ["--grpc-port", "0", "--model", INSTANT_MODEL], args.seconds, "instant"
        ),
        "uvicorn": lambda: floor_rate(args.seconds),
        "app": lambda: app_rate(args.seconds),
    }
    names = [name for name in STEPS if name in args.steps]
    other: Path | None = args.compare_dir
    if other is not None:
        # The same steps of the other checkout, measured in turn with this one's.
        twins: dict[str, Callable[[], Measured]] = {
            "server": lambda: served_rate(["--grpc-port", "0"], args.seconds, "server-o", other),
            "instant": lambda: served_rate(
                ["--grpc-port", "0", "--model", INSTANT_MODEL], args.seconds, "instant-o", other
            ),
            "app": lambda: app_rate(args.seconds, other),
        }
        for name in [name for name in names if name in twins]:
            steps[f"{name}@{other.name}"] = twins[name]
            names.insert(names.index(name) + 1, f"{name}@{other.name}")
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        measured = {name: steps[name]() for name in order}
        rates = {name: step.items_per_s for name, step in measured.items()}
        ms = {name: 1000.0 / rate for name, rate in rates.items()}
        row: dict[str, Any] = {
            "round": index + 1,
            "order": order,
            "items_per_s": {name: round(rate, 1) for name, rate in rates.items()},
            "ms_per_request": {name: round(value, 3) for name, value in ms.items()},
            "server_cpu_ms": {
                name: round(step.server_cpu_ms, 3)
                for name, step in measured.items()
                if step.server_cpu_ms is not None
            },
            "calls_per_request": {
                name: round(step.calls, 1) for name, step in measured.items() if step.calls
            },
        }
        if measured.get("app") is not None and measured["app"].parts:
            row["app_parts_ms"] = {
                key: round(value, 3) for key, value in (measured["app"].parts or {}).items()
            }
        if "server" in ms:
            row["server_model_step_ms"] = round(measured["server"].model_step_ms or 0.0, 3)
        if "server" in ms and "engine" in ms:
            row["server_adds_ms"] = round(ms["server"] - ms["engine"], 3)
            row["server_vs_engine"] = round(rates["server"] / rates["engine"], 3)
        if "instant" in ms and "uvicorn" in ms:
            row["instant_adds_ms"] = round(ms["instant"] - ms["uvicorn"], 3)
            row["instant_vs_uvicorn"] = round(ms["instant"] / ms["uvicorn"], 3)
            cpu = row["server_cpu_ms"]
            row["instant_cpu_vs_uvicorn"] = round(cpu["instant"] / cpu["uvicorn"], 3)
        rounds.append(row)
        print(json.dumps(row), flush=True)

    def median(key: str, within: str | None = None) -> float:
        values = [float(row[within][key] if within else row[key]) for row in rounds]
        return round(statistics.median(values), 3)

    medians: dict[str, Any] = {name: median(name, "ms_per_request") for name in names}
    medians["server_cpu_ms"] = {
        name: median(name, "server_cpu_ms") for name in rounds[0]["server_cpu_ms"]
    }
    medians["calls_per_request"] = {
        name: median(name, "calls_per_request") for name in rounds[0]["calls_per_request"]
    }
    if "app_parts_ms" in rounds[0]:
        medians["app_parts_ms"] = {
            key: median(key, "app_parts_ms") for key in rounds[0]["app_parts_ms"]
        }
    for key in (
        "server_model_step_ms",
        "server_adds_ms",
        "server_vs_engine",
        "instant_adds_ms",
        "instant_vs_uvicorn",
        "instant_cpu_vs_uvicorn",
    ):
        if key in rounds[0]:
            medians[key] = median(key)
    return {
        "command": " ".join(["python", "benchmarks/one_client.py", *sys.argv[1:]]),
        "steps": names,
        "rounds": rounds,
        "median": medians,
    }


#: The table's columns: title, and how a row (or the medians) shows it, or None without it.
COLUMNS: list[tuple[str, Callable[[dict[str, Any], dict[str, Any]], str | None]]] = [
    ("engine alone", lambda ms, row: _ms(ms, "engine")),
    ("server", lambda ms, row: _ms(ms, "server")),
    ("its model step", lambda ms, row: _ms(row, "server_model_step_ms")),
    ("server adds", lambda ms, row: _ms(row, "server_adds_ms")),
    ("instant model served", lambda ms, row: _ms(ms, "instant")),
    ("bare uvicorn", lambda ms, row: _ms(ms, "uvicorn")),
    ("instant adds", lambda ms, row: _ms(row, "instant_adds_ms")),
    ("instant / uvicorn", lambda ms, row: _ratio(row, "instant_vs_uvicorn")),
    ("instant's server CPU", lambda ms, row: _ms(row["server_cpu_ms"], "instant")),
    ("uvicorn's server CPU", lambda ms, row: _ms(row["server_cpu_ms"], "uvicorn")),
    ("CPU: instant / uvicorn", lambda ms, row: _ratio(row, "instant_cpu_vs_uvicorn")),
    ("app alone, no HTTP", lambda ms, row: _ms(ms, "app")),
    ("its CPU", lambda ms, row: _ms(row["server_cpu_ms"], "app")),
    ("its calls per request", lambda ms, row: _calls(row["calls_per_request"], "app")),
    ("its middleware and routing", lambda ms, row: _ms(row.get("app_parts_ms", {}), "stack")),
    ("its thread hand-off", lambda ms, row: _ms(row.get("app_parts_ms", {}), "handoff")),
    ("server / engine", lambda ms, row: _ratio(row, "server_vs_engine")),
]


def _ms(values: dict[str, Any], key: str) -> str | None:
    return f"{values[key]:.3f} ms" if key in values else None


def _calls(values: dict[str, Any], key: str) -> str | None:
    return f"{values[key]:.0f}" if key in values else None


def _ratio(values: dict[str, Any], key: str) -> str | None:
    return f"{values[key]:.2f}" if key in values else None


def _twin_ms(name: str) -> Callable[[dict[str, Any], dict[str, Any]], str | None]:
    return lambda ms, row: _ms(ms, name)


def _twin_cpu(name: str) -> Callable[[dict[str, Any], dict[str, Any]], str | None]:
    return lambda ms, row: _ms(row["server_cpu_ms"], name)


def _twin_calls(name: str) -> Callable[[dict[str, Any], dict[str, Any]], str | None]:
    return lambda ms, row: _calls(row["calls_per_request"], name)


def table(result: dict[str, Any]) -> str:
    median = result["median"]
    columns = list(COLUMNS)
    for name in [name for name in result["steps"] if "@" in name]:
        columns.append((name, _twin_ms(name)))
        columns.append((f"{name} CPU", _twin_cpu(name)))
        if name.startswith("app@"):
            columns.append((f"{name} calls", _twin_calls(name)))
    shown = [(title, cell) for title, cell in columns if cell(median, median) is not None]
    lines = [
        "| round | " + " | ".join(title for title, _ in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for row in result["rounds"]:
        cells = [cell(row["ms_per_request"], row) or "" for _, cell in shown]
        lines.append(f"| {row['round']} | " + " | ".join(cells) + " |")
    cells = [cell(median, median) or "" for _, cell in shown]
    lines.append("| median | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"which to measure, comma-separated (default: all of {','.join(STEPS)})",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the rounds here (JSON)")
    parser.add_argument(
        "--compare-dir",
        type=Path,
        default=None,
        help="another checkout (an export of an older commit): its server, instant and app "
        "steps are measured too, each in turn with this checkout's",
    )
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_floor:
        serve_floor(args.host, args.port)
        return 0
    args.steps = [step.strip() for step in args.steps.split(",") if step.strip()]
    unknown = sorted(set(args.steps) - set(STEPS))
    if unknown or not args.steps:
        parser.error(f"--steps takes some of {','.join(STEPS)}, not {','.join(unknown)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    result = run(args)
    return finish(result, table(result), args.out)


if __name__ == "__main__":
    sys.exit(main())
