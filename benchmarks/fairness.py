"""Fairness to small requests beside a huge one, on the default model.

Starts ``python server.py``, warms it up, then runs one closed-loop client sending 1,024-item
requests alone for ``--seconds``, then the same client beside 16 closed-loop clients sending
one text each for ``--seconds``. Reports the single-text clients' p99 and the big client's
items/s beside them as a share of what it gets alone. Targets (the "fair and bounded" issue):
single-text p99 under 1 s, big client at least half its solo items/s.

    python benchmarks/fairness.py                      # 60 s per phase
    python benchmarks/fairness.py --seconds 5          # a smoke run
    python benchmarks/fairness.py --server-arg=--max-batch-size=64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.serverproc import ServerProcess  # noqa: E402
from load_test.soak import Mix, run_soak, summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per phase (60)")
    parser.add_argument("--warmup-seconds", type=float, default=10.0, help="unrecorded first (10)")
    parser.add_argument("--small", type=int, default=16, help="single-text clients (16)")
    parser.add_argument("--big-items", type=int, default=1024, help="items per big request")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    log = ROOT / "load_test_results" / "fairness-server.log"
    with ServerProcess(args.server_arg, cwd=ROOT, log_path=log) as server:
        run_soak(
            server.url, Mix(small=4, big=1, big_items=args.big_items), duration=args.warmup_seconds
        )
        alone = summary(
            run_soak(
                server.url, Mix(small=0, big=1, big_items=args.big_items), duration=args.seconds
            )
        )
        shared = summary(
            run_soak(
                server.url,
                Mix(small=args.small, big=1, big_items=args.big_items),
                duration=args.seconds,
            )
        )
    solo = alone["kinds"]["big"]["items_per_s"]
    beside = shared["kinds"]["big"]["items_per_s"]
    small = shared["kinds"].get("small", {})
    ratio = beside / solo if solo else 0.0
    p99 = small.get("p99_ms")
    print("| phase | big client items/s | single-text p99 ms | single-text answers/s |")
    print("|---|---|---|---|")
    print(f"| big client alone | {solo:.0f} | - | - |")
    answers = small.get("ok_per_s", 0.0)
    print(f"| big + {args.small} single-text | {beside:.0f} | {p99} | {answers:.1f} |")
    print(f"big client keeps {ratio:.0%} of its solo items/s (target >= 50%)")
    print(f"single-text p99 {p99} ms (target < 1000 ms)")
    ok = ratio >= 0.5 and p99 is not None and p99 < 1000
    print("targets met" if ok else "TARGETS MISSED")
    if args.out:
        args.out.write_text(
            json.dumps({"alone": alone, "shared": shared, "ratio": ratio}, indent=2)
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
