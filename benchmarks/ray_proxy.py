"""What Ray Serve's proxy costs: the same model and load through Ray's proxy (one replica,
``batching.ray:build_app``) and straight to ``python server.py``, on this machine.

    python benchmarks/ray_proxy.py --concurrency 64 --seconds 20 [-- server flags]

Needs ``pip install -e ".[ray]"``. The two are measured one after the other, with the same
load tool and the same closed-loop load; both are printed with their ratio as JSON
(``--json FILE`` writes them too). The Ray cluster gets all the cores and the replica
reserves ``--num-cpus`` of them (default: all, so its torch threads match the direct
server's); Ray's proxy takes CPU beside it, which is the cost this measures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._load import load, report  # noqa: E402
from load_test.serverproc import ServerProcess, free_port  # noqa: E402


def ray_args(flags: list[str], num_cpus: str) -> dict[str, str]:
    """``--max-batch-size 8`` -> ``{"max_batch_size": "8"}``, plus the replica options."""
    args = {"replicas": "1", "num_cpus": num_cpus}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        args[flag.lstrip("-").replace("-", "_")] = value
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--num-cpus", default=str(os.cpu_count() or 1), help="CPUs Ray reserves for the replica"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("server_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    flags = [flag for flag in args.server_flags if flag != "--"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        with ServerProcess(
            [*flags, "--grpc-port", "0"], cwd=ROOT, log_path=Path(tmp) / "server.log"
        ) as server:
            results.append(
                load(server.url, args.concurrency, args.seconds, Path(tmp) / "direct", "direct")
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray
            from ray import serve

            from batching.ray import build_app
        port = free_port()
        ray.init(
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build_app(ray_args(flags, args.num_cpus)), name="batching", route_prefix="/")
            results.append(
                load(
                    f"http://127.0.0.1:{port}",
                    args.concurrency,
                    args.seconds,
                    Path(tmp) / "ray",
                    "through Ray's proxy",
                )
            )
        finally:
            serve.shutdown()
            ray.shutdown()
    doc = {
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "server_flags": flags,
        "results": results,
        "ray_over_direct": round(results[1]["items_per_s"] / results[0]["items_per_s"], 3),
    }
    report(doc, args.json)


if __name__ == "__main__":
    main()
