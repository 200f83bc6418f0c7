"""Triton's perf_analyzer and our own load tool on the same loads, against one server.

Starts ``python server.py`` (the default model, HTTP and gRPC), then at each concurrency
(closed loop, one sentence per request, 1 and 64 clients by default) runs:

- perf_analyzer over HTTP with binary tensors (its default), over HTTP with JSON tensors, and
  over gRPC, each until its measurement is stable (``-s``);
- ``python -m load_test run`` with the same sentences over KServe v2 HTTP (JSON).

and prints one table: items/s, p50 and p99 as each client measured them, and, for
perf_analyzer, the server's own split of a request's time (queue and compute, from the
statistics extension). The two tools measure differently (perf_analyzer: threads of
synchronous clients, its own stability rule; load_test: one asyncio process), so compare
servers with one tool, and the tools with each other only on one machine in one run.

    bash scripts/install-perf-analyzer.sh        # once
    python benchmarks/perf_analyzer.py           # c=1 and c=64, 5 s windows, 15 s load_test
    python benchmarks/perf_analyzer.py --concurrency 1,8,64 --json pa.json -- --max-batch-size 64

Arguments after ``--`` go to ``server.py``. This is a benchmark: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.serverproc import ServerProcess, free_port  # noqa: E402

PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"
MODEL = "all-MiniLM-L6-v2"

SUBJECTS = ["The cat", "A scientist", "My neighbour", "The old train", "A small robot", "Anna"]
VERBS = ["reads", "builds", "watches", "paints", "repairs", "finds"]


def sentences(count: int) -> list[str]:
    """Distinct short sentences (8-12 tokens), as in benchmarks/serving.py."""
    return [
        f"{SUBJECTS[index % len(SUBJECTS)]} {VERBS[(index // 6) % len(VERBS)]} a book on "
        f"day {index}."
        for index in range(count)
    ]


def perf_analyzer(
    url: str, protocol: str, concurrency: int, data: Path, out_csv: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One perf_analyzer run; its CSV row in ms and items/s, or why it failed."""
    formats = {
        "http": [],
        "http-json": ["--input-tensor-format", "json", "--output-tensor-format", "json"],
        "grpc": [],
    }[protocol]
    command = [
        str(PERF_ANALYZER),
        "-m",
        args.model,
        "-u",
        url,
        "-i",
        "grpc" if protocol == "grpc" else "http",
        *formats,
        "--input-data",
        str(data),
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--measurement-interval",
        str(args.measurement_ms),
        "-s",
        str(args.stability),
        "-f",
        str(out_csv),
    ]
    print("$", " ".join(command), flush=True)
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0 or not out_csv.exists():
        tail = (finished.stdout + finished.stderr).strip().splitlines()[-3:]
        return {"error": f"exit {finished.returncode}: {' / '.join(tail)}"}
    with out_csv.open() as handle:
        row = next(csv.DictReader(handle))

    def ms(column: str) -> float:
        return float(row[column]) / 1000  # perf_analyzer writes microseconds

    return {
        "items_per_s": float(row["Inferences/Second"]),
        "p50_ms": ms("p50 latency"),
        "p99_ms": ms("p99 latency"),
        "server_queue_ms": ms("Server Queue"),
        "server_compute_ms": ms("Server Compute Infer"),
    }


def server_statistics(url: str, model: str) -> dict[str, Any]:
    """The model's statistics (Triton's extension), as the server counts them."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        document: dict[str, Any] = json.load(response)
    return dict(document["model_stats"][0]["inference_stats"])


def server_split(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    """Mean queue and compute ms per successful request between two statistics."""
    count = after["success"]["count"] - before["success"]["count"]
    if count <= 0:
        return {"server_queue_ms": None, "server_compute_ms": None}

    def mean_ms(key: str) -> float:
        return float(after[key]["ns"] - before[key]["ns"]) / count / 1e6

    return {"server_queue_ms": mean_ms("queue"), "server_compute_ms": mean_ms("compute_infer")}


def load_test(
    url: str,
    model: str,
    concurrency: int,
    texts: Path,
    out_dir: Path,
    pid: int | None,
    seconds: float,
) -> dict[str, Any]:
    """One ``python -m load_test run`` closed loop over v2 HTTP with the same sentences; the
    server's queue/compute split comes from its statistics before and after the run (its
    warm-up requests included)."""
    command = [
        sys.executable,
        "-m",
        "load_test",
        "run",
        "--url",
        url,
        "-c",
        str(concurrency),
        "-d",
        str(seconds),
        "--warmup",
        str(max(16, 4 * concurrency)),
        "--api",
        "v2",
        "--model-name",
        model,
        "--items",
        "1",
        "--payload-file",
        str(texts),
        "--out-dir",
        str(out_dir),
        "--no-plots",
        "--no-progress",
        *(["--server-pid", str(pid)] if pid else []),
    ]
    print("$", " ".join(command), flush=True)
    before = server_statistics(url, model)
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    after = server_statistics(url, model)
    result = out_dir / "result.json"
    if finished.returncode != 0 or not result.exists():
        tail = (finished.stdout + finished.stderr).strip().splitlines()[-3:]
        return {"error": f"exit {finished.returncode}: {' / '.join(tail)}"}
    summary = json.loads(result.read_text())["summary"]
    return {
        "items_per_s": summary["throughput"]["items_per_s"],
        "p50_ms": summary["latency"]["p50_ms"],
        "p99_ms": summary["latency"]["p99_ms"],
        "error_rate": summary["error_rate"],
        **server_split(before, after),
    }


def _cell(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    print(
        "| client | protocol | clients | items/s | p50 ms | p99 ms | server queue ms "
        "| server compute ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        figures = row["result"]
        if "error" in figures:
            print(
                f"| {row['client']} | {row['protocol']} | {row['concurrency']} | "
                f"failed: {figures['error']} | | | | |"
            )
            continue
        print(
            f"| {row['client']} | {row['protocol']} | {row['concurrency']} | "
            f"{_cell(figures['items_per_s'])} | {_cell(figures['p50_ms'])} | "
            f"{_cell(figures['p99_ms'])} | {_cell(figures.get('server_queue_ms'), 2)} | "
            f"{_cell(figures.get('server_compute_ms'), 2)} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,64", help="comma list of client counts")
    parser.add_argument(
        "--protocols",
        default="http,http-json,grpc",
        help="perf_analyzer runs: http (binary tensors), http-json, grpc",
    )
    parser.add_argument("--measurement-ms", type=int, default=5000, help="perf_analyzer window")
    parser.add_argument(
        "--stability", type=int, default=10, help="perf_analyzer -s (percent; 10 is its default)"
    )
    parser.add_argument("--load-test-seconds", type=float, default=15.0)
    parser.add_argument("--no-load-test", action="store_true")
    parser.add_argument("--model", default=MODEL, help="the name the server gives the model")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)
    if not (Path(os.environ.get("PERF_ANALYZER_VENV", ROOT / ".venv-pa")) / "bin").exists():
        print("perf_analyzer is not installed: bash scripts/install-perf-analyzer.sh")
        return 2
    levels = [int(level) for level in args.concurrency.split(",")]
    protocols = [protocol for protocol in args.protocols.split(",") if protocol]

    work = Path(tempfile.mkdtemp(prefix="perf_analyzer-"))
    texts = sentences(64)
    data = work / "input_data.json"
    data.write_text(json.dumps({"data": [{"text": [text]} for text in texts]}))
    payloads = work / "texts.json"
    payloads.write_text(json.dumps(texts))
    grpc_port = free_port()
    log = ROOT / "load_test_results" / "perf-analyzer-server.log"
    rows: list[dict[str, Any]] = []
    server_args = ["--grpc-port", str(grpc_port), *args.server_args]
    with ServerProcess(server_args, cwd=ROOT, log_path=log) as server:
        http_url = f"127.0.0.1:{server.port}"
        for concurrency in levels:
            for protocol in protocols:
                url = f"127.0.0.1:{grpc_port}" if protocol == "grpc" else http_url
                out_csv = work / f"pa-{protocol}-c{concurrency}.csv"
                result = perf_analyzer(url, protocol, concurrency, data, out_csv, args)
                rows.append(
                    {
                        "client": "perf_analyzer",
                        "protocol": protocol,
                        "concurrency": concurrency,
                        "result": result,
                    }
                )
                print(rows[-1], flush=True)
            if not args.no_load_test:
                result = load_test(
                    server.url,
                    args.model,
                    concurrency,
                    payloads,
                    work / f"load_test-c{concurrency}",
                    server.pid,
                    args.load_test_seconds,
                )
                rows.append(
                    {
                        "client": "load_test",
                        "protocol": "http-json",
                        "concurrency": concurrency,
                        "result": result,
                    }
                )
                print(rows[-1], flush=True)
    print_table(rows)
    print(f"\nfiles: {work} (CSV and load_test results), server log {log}")
    if args.json:
        args.json.write_text(json.dumps({"server_args": server_args, "rows": rows}, indent=2))
    return 0 if all("error" not in row["result"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
