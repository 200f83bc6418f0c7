"""What each embedding option costs against plain float embeddings, and what compact encodings save.

Starts ``python server.py`` once on the default model (all-MiniLM-L6-v2) served from a copy of
its folder whose ``config_sentence_transformers.json`` adds two instruction prompts (``query:``
and ``passage:``, as e5-style models name them), so that ``prompt_name`` has something to
choose. Then, round after round, it runs a closed loop of one-sentence requests at each
concurrency for each option in turn (interleaved, so drift on a shared machine hits them
alike): plain float JSON (the baseline), a prompt, left truncation, ``truncate: false``, fewer
dimensions, every encoding (``base64``, ``int8``, ``uint8``, ``binary``, ``ubinary``), the
same through the OpenAI door, per-token vectors (``/embed_all``) and ``/tokenize``.

Prints, per option and concurrency, the medians over the rounds of items/s, p50 and p99, the
server's CPU per item (its process CPU time over the items served), the bytes of one answer,
and each of those as a ratio of the baseline's. End to end, the model's compute is nearly all
of the server's CPU per item, so a cheaper answer hardly shows there; a second table therefore
times, in this process, what each encoding changes in the server's work per request: turning
the model's float vectors into the encoding and the answer into bytes (the plain door's own
functions, 32 vectors of 384 dimensions per request, median of 2,000 runs).

    python benchmarks/embedding_options.py                  # c=1 and c=64, 3 rounds of 6 s
    python benchmarks/embedding_options.py --rounds 5 --seconds 10 --json options.json
    python benchmarks/embedding_options.py --answers-only     # the second table alone, no server

This is a benchmark: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batching.codecs.embed_options import encode_vector  # noqa: E402
from batching.codecs.plain import encode_embeddings  # noqa: E402
from batching.models.default import default_model_path  # noqa: E402
from batching.models.embedding.quantize import quantize  # noqa: E402
from load_test.client import LoadSpec, Target, run_load  # noqa: E402
from load_test.payloads import Payload, PayloadSet, make_sentence  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402
from load_test.stats import percentile  # noqa: E402

MODEL = "minilm-prompts"
PROMPTS = {"query": "query: ", "passage": "passage: "}

Body = Callable[[str], dict[str, Any]]


def _plain(**options: Any) -> Body:
    return lambda text: {"inputs": [text], **options}


def _openai(encoding: str) -> Body:
    return lambda text: {"model": MODEL, "input": [text], "encoding_format": encoding}


#: (label, path, body of one text); the first is the baseline every ratio is taken against.
OPTIONS: tuple[tuple[str, str, Body], ...] = (
    ("float (baseline)", "/", _plain()),
    ("prompt_name=query", "/", _plain(prompt_name="query")),
    ("truncation_direction=left", "/", _plain(truncation_direction="left")),
    ("truncate=false", "/", _plain(truncate=False)),
    ("dimensions=128", "/", _plain(dimensions=128)),
    ("encoding=base64", "/", _plain(encoding="base64")),
    ("encoding=int8", "/", _plain(encoding="int8")),
    ("encoding=uint8", "/", _plain(encoding="uint8")),
    ("encoding=binary", "/", _plain(encoding="binary")),
    ("encoding=ubinary", "/", _plain(encoding="ubinary")),
    ("encoding=int8, dimensions=128", "/", _plain(encoding="int8", dimensions=128)),
    ("OpenAI float", "/v1/embeddings", _openai("float")),
    ("OpenAI base64", "/v1/embeddings", _openai("base64")),
    ("OpenAI int8", "/v1/embeddings", _openai("int8")),
    ("OpenAI ubinary", "/v1/embeddings", _openai("ubinary")),
    ("/embed_all (per-token vectors)", "/embed_all", lambda text: {"inputs": [text]}),
    ("/tokenize", "/tokenize", lambda text: {"inputs": [text]}),
)


def prompted_copy(into: Path) -> Path:
    """The default model's folder, linked file by file, with prompts added to its config."""
    source = default_model_path()
    folder = into / MODEL
    shutil.copytree(source, folder, copy_function=_link)
    config_path = folder / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config_path.unlink(missing_ok=True)
    config["prompts"] = PROMPTS
    config["default_prompt_name"] = None
    config_path.write_text(json.dumps(config))
    return folder


def _link(source: str, target: str) -> None:
    Path(target).symlink_to(Path(source).resolve())


def payloads(path: str, body: Body, count: int = 512, seed: int = 7) -> PayloadSet:
    rng = random.Random(seed)
    texts = [make_sentence(rng, 12) for _ in range(count)]
    return PayloadSet(
        api="json",
        path=path,
        content_type="application/json",
        payloads=tuple(Payload(body=orjson.dumps(body(text)), items=1) for text in texts),
        model_name=MODEL,
    )


def answer_bytes(url: str, path: str, body: Body) -> int:
    """The size of one answer's body, and a check that the option is served (status 200)."""
    request = urllib.request.Request(
        url + path,
        data=orjson.dumps(body("The quick brown fox jumps over the lazy dog near the river.")),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return len(response.read())


def measure(
    target: Target, load: PayloadSet, concurrency: int, seconds: float, server_pid: int
) -> dict[str, float]:
    spec = LoadSpec(payloads=load, concurrency=concurrency, duration=seconds, validate=False)
    result = asyncio.run(run_load(target, spec, server_pid=server_pid))
    records = result.records
    latencies = sorted(
        1000 * (done - sent)
        for done, sent, status in zip(records.done, records.sent, records.status, strict=True)
        if status == 200
    )
    return {
        "items_per_s": records.ok / result.wall_s,
        "p50_ms": percentile(latencies, 50) if latencies else float("nan"),
        "p99_ms": percentile(latencies, 99) if latencies else float("nan"),
        "errors": float(len(records) - records.ok),
        "server_cpu_ms_per_item": (
            1000 * result.server_cpu_s / max(1, records.ok)
            if result.server_cpu_s is not None
            else float("nan")
        ),
    }


#: (label, encoding the model applies, base64 on the wire) for the answer-encoding table.
ENCODINGS = (
    ("float", "float", False),
    ("base64", "float", True),
    ("int8", "int8", False),
    ("uint8", "uint8", False),
    ("binary", "binary", False),
    ("ubinary", "ubinary", False),
    ("int8+base64", "int8", True),
    ("ubinary+base64", "ubinary", True),
)


def answer_cost(items: int = 32, dim: int = 384, runs: int = 2000) -> dict[str, dict[str, float]]:
    """Per encoding, the median microseconds to encode one request's ``items`` unit vectors
    and serialise the answer, and the answer's bytes."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((items, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ranges = np.stack([vectors.min(axis=0), vectors.max(axis=0)])
    costs: dict[str, dict[str, float]] = {}
    for label, encoding, as_base64 in ENCODINGS:
        times = []
        body = b""
        for _ in range(runs):
            started = time.perf_counter_ns()
            encoded = quantize(vectors, encoding, ranges if encoding.endswith("int8") else None)
            body = encode_embeddings(
                MODEL,
                [encode_vector(row, as_base64) for row in encoded],
                truncated=[False] * items,
                tokens=items * 14,
            )
            times.append(time.perf_counter_ns() - started)
        costs[label] = {"us": statistics.median(times) / 1000, "bytes": float(len(body))}
    return costs


def print_answer_costs(costs: dict[str, dict[str, float]]) -> None:
    print()
    print("| encoding | µs per request of 32 vectors | ÷ float | answer bytes | ÷ float |")
    print("|---|---|---|---|---|")
    base = costs["float"]
    for label, cost in costs.items():
        print(
            f"| {label} | {cost['us']:.0f} | {cost['us'] / base['us']:.3f} "
            f"| {cost['bytes']:.0f} | {cost['bytes'] / base['bytes']:.3f} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    parser.add_argument("--concurrency", default="1,64", help="comma list of client counts")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument(
        "--answers-only", action="store_true", help="only the answer-encoding table"
    )
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)
    if args.answers_only:
        print_answer_costs(answer_cost())
        return 0
    levels = [int(level) for level in args.concurrency.split(",")]
    log = ROOT / "load_test_results" / "embedding-options-server.log"
    log.parent.mkdir(exist_ok=True)
    results: dict[str, dict[int, list[dict[str, float]]]] = {
        label: {level: [] for level in levels} for label, _, _ in OPTIONS
    }
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = prompted_copy(Path(scratch))
        server_args = ["--model", str(folder), "--grpc-port", "0", *args.server_args]
        with ServerProcess(server_args, cwd=ROOT, log_path=log) as server:
            target = Target.parse(server.url)
            loads = {label: payloads(path, body) for label, path, body in OPTIONS}
            for label, path, body in OPTIONS:  # served at all, the answer's size, warm
                sizes[label] = answer_bytes(server.url, path, body)
                measure(target, loads[label], 8, 1.0, server.pid)
            for round_ in range(args.rounds):
                for level in levels:
                    for label, _, _ in OPTIONS:
                        figures = measure(target, loads[label], level, args.seconds, server.pid)
                        results[label][level].append(figures)
                        print(
                            f"round {round_ + 1} c={level} {label}: "
                            f"{figures['items_per_s']:.0f} items/s, "
                            f"p99 {figures['p99_ms']:.1f} ms, errors {figures['errors']:.0f}, "
                            f"server CPU {figures['server_cpu_ms_per_item']:.2f} ms/item",
                            flush=True,
                        )
    baseline = OPTIONS[0][0]
    print()
    print(
        "| option | clients | items/s | ÷ float | p50 ms | p99 ms | server CPU ms/item "
        "| ÷ float | answer bytes | ÷ float | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for level in levels:
        base = statistics.median(r["items_per_s"] for r in results[baseline][level])
        base_cpu = statistics.median(r["server_cpu_ms_per_item"] for r in results[baseline][level])
        for label, _, _ in OPTIONS:
            rounds = results[label][level]
            rate = statistics.median(r["items_per_s"] for r in rounds)
            cpu = statistics.median(r["server_cpu_ms_per_item"] for r in rounds)
            row = {
                "items_per_s": rate,
                "ratio": rate / base,
                "p50_ms": statistics.median(r["p50_ms"] for r in rounds),
                "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
                "server_cpu_ms_per_item": cpu,
                "cpu_ratio": cpu / base_cpu,
                "answer_bytes": sizes[label],
                "bytes_ratio": sizes[label] / sizes[baseline],
                "errors": sum(r["errors"] for r in rounds),
            }
            summary.setdefault(label, {})[level] = row
            print(
                f"| {label} | {level} | {rate:.0f} | {row['ratio']:.3f} | {row['p50_ms']:.1f} "
                f"| {row['p99_ms']:.1f} | {cpu:.2f} | {row['cpu_ratio']:.3f} "
                f"| {sizes[label]} | {row['bytes_ratio']:.3f} | {row['errors']:.0f} |"
            )
    costs = answer_cost()
    print_answer_costs(costs)
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "rounds": results, "answers": costs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
