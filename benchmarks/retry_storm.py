"""Retry storms: goodput while 256 clients retry every 503 at once, and how soon admission
is back to normal afterwards, on the default model.

For each deadline (the server's default, and ``--timeout-ms 250``) it starts
``python server.py``, warms it up, and then:

1. capacity without retries: ``--capacity-clients`` (32, one batch) closed-loop one-text
   clients that wait what Retry-After says after a 503, for ``--capacity-seconds``: 200
   answers per second;
2. the storm: ``--clients`` one-text clients that resend at once after every 503 (ignoring
   Retry-After, no backoff), for ``--seconds``: 200s per second (goodput), 503s per second
   and 504s, per window. ``--storms`` says how they resend: ``same`` on the same keep-alive
   connection, ``new`` on a new connection each time (the 503's closed first); each storm
   runs on the same server, after the same capacity phase;
3. after the storm: ``--after-clients`` polite clients for ``--after-seconds``, in 1 s
   windows: the recovery time (from the storm's end to the first window from which on no
   polite request is refused) and the share of polite requests refused after it.

Targets: storm goodput at least 0.8x the capacity, no 504 (an admitted request finishes
within its deadline), recovery within seconds.

    python benchmarks/retry_storm.py                                   # 60 s storms
    python benchmarks/retry_storm.py --seconds 5 --capacity-seconds 5 --after-seconds 5
    python benchmarks/retry_storm.py --deadlines 250 --storms new --seconds 15
    # this checkout against another one (an export of an older commit), interleaved, 3 rounds:
    python benchmarks/retry_storm.py --deadlines 250 --compare-dir ../base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.serverproc import ServerProcess  # noqa: E402
from load_test.soak import Mix, run_soak, summary  # noqa: E402


def recovery(windows: list[dict[str, Any]]) -> tuple[float | None, float]:
    """Seconds until polite clients stop being refused, and the share refused after that."""
    refused = [w["kinds"].get("polite", {}).get("refused_per_s", 0.0) for w in windows]
    clean_from = len(windows)
    for index in range(len(windows) - 1, -1, -1):
        if refused[index] > 0:
            break
        clean_from = index
    if clean_from == len(windows):
        return None, 1.0
    start = 0.0 if clean_from == 0 else windows[clean_from - 1]["end"]
    return start, 0.0


#: What ``--storms`` names, and the soak's client kind for each.
STORM_KINDS = {"same": "retry", "new": "reconnect"}


def one_setting(
    label: str, flags: list[str], args: argparse.Namespace, root: Path = ROOT
) -> list[dict[str, Any]]:
    log = ROOT / "load_test_results" / f"retry-storm-{label}-server.log"
    rows = []
    command = "{python} " + shlex.quote(str(root / "server.py"))
    with ServerProcess(flags + args.server_arg, command=command, cwd=root, log_path=log) as server:
        run_soak(server.url, Mix(small=0, big=0, polite=32), duration=args.warmup_seconds)
        capacity = summary(
            run_soak(
                server.url,
                Mix(small=0, big=0, polite=args.capacity_clients),
                duration=args.capacity_seconds,
            )
        )
        cap = capacity["kinds"]["polite"]["ok_per_s"]
        for storm_name in [s.strip() for s in args.storms.split(",") if s.strip()]:
            kind = STORM_KINDS[storm_name]
            storm = run_soak(
                server.url,
                Mix(small=0, big=0, **{kind: args.clients}),
                duration=args.seconds,
                window=args.window,
                on_window=lambda w, kind=kind: print(
                    f"  storm ({kind}) t={w['end']:.0f}s goodput {w['goodput_per_s']:.0f}/s "
                    f"503s {w['kinds'].get(kind, {}).get('refused_per_s', 0):.0f}/s "
                    f"504s {w['kinds'].get(kind, {}).get('timeouts_per_s', 0):.0f}/s",
                    flush=True,
                ),
            )
            after = run_soak(
                server.url,
                Mix(small=0, big=0, polite=args.after_clients),
                duration=args.after_seconds,
                window=1.0,
            )
            stormed = summary(storm)["kinds"][kind]
            recovered_s, _ = recovery(after.windows)
            after_summary = summary(after)["kinds"].get("polite", {})
            refused_share = after_summary.get("refused", 0) / max(
                1, after_summary.get("requests", 1)
            )
            # The sampler's first window closes at the start: no requests in it yet.
            windows = [w["goodput_per_s"] for w in storm.windows if w["end"] >= args.window / 2]
            rows.append(
                {
                    "setting": label,
                    "storm": storm_name,
                    "capacity_per_s": cap,
                    "storm_goodput_per_s": stormed["ok_per_s"],
                    "storm_min_window_goodput_per_s": min(windows) if windows else None,
                    "storm_503_per_s": round(stormed["refused"] / max(1e-9, args.seconds), 1),
                    "storm_504s": stormed["timed_out"],
                    "storm_other_errors": stormed["errors"],
                    "ratio": stormed["ok_per_s"] / cap if cap else 0.0,
                    "recovery_s": recovered_s,
                    "polite_refused_share_after": refused_share,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="storm length (60)")
    parser.add_argument("--clients", type=int, default=256, help="retry-at-once clients (256)")
    parser.add_argument("--capacity-seconds", type=float, default=30.0, help="(30)")
    parser.add_argument(
        "--capacity-clients",
        type=int,
        default=32,
        help="closed-loop clients for the capacity phase: one batch (32), which the "
        "next-batch admission rule does not refuse (32)",
    )
    parser.add_argument("--after-seconds", type=float, default=20.0, help="(20)")
    parser.add_argument("--after-clients", type=int, default=16, help="(16)")
    parser.add_argument("--warmup-seconds", type=float, default=10.0, help="(10)")
    parser.add_argument("--window", type=float, default=5.0, help="storm report window, s (5)")
    parser.add_argument(
        "--deadlines",
        default="default,250",
        help="comma list: 'default' (the server's own) and/or deadlines in ms (default,250)",
    )
    parser.add_argument(
        "--storms",
        default="same,new",
        help="comma list: 'same' (resend on the same connection) and/or 'new' (a new "
        "connection for every resend) (same,new)",
    )
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG")
    parser.add_argument(
        "--compare-dir",
        type=Path,
        help="another checkout of the project whose server.py runs each setting too, "
        "interleaved with this one's (rows say which)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat everything (1)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    rows = []
    roots = [("this", ROOT)]
    if args.compare_dir is not None:
        roots.append((args.compare_dir.name, args.compare_dir.resolve()))
    for _ in range(args.rounds):
        for deadline in [d.strip() for d in args.deadlines.split(",") if d.strip()]:
            flags = [] if deadline == "default" else ["--timeout-ms", deadline]
            label = "default deadline" if deadline == "default" else f"--timeout-ms {deadline}"
            for name, root in roots:
                print(f"{label} ({name}):", flush=True)
                for row in one_setting(deadline, flags, args, root):
                    row["setting"] = label if len(roots) == 1 else f"{label} ({name})"
                    rows.append(row)
    print(
        "| setting | storm | capacity 200s/s | storm 200s/s | ratio | worst window 200s/s "
        "| 503s/s | 504s | recovery s | polite refused after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for row in rows:
        print(
            f"| {row['setting']} | {row['storm']} | {row['capacity_per_s']:.0f} "
            f"| {row['storm_goodput_per_s']:.0f} | {row['ratio']:.2f} "
            f"| {row['storm_min_window_goodput_per_s']} | {row['storm_503_per_s']:.0f} "
            f"| {row['storm_504s']} | {row['recovery_s']} "
            f"| {row['polite_refused_share_after']:.1%} |"
        )
        ok = ok and row["ratio"] >= 0.8 and row["recovery_s"] is not None
        ok = ok and row["storm_504s"] == 0
    print("targets met" if ok else "TARGETS MISSED")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
