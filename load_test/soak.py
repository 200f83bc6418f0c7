"""A soak: a mix of the clients real traffic holds, for a chosen time, and what the server's
process does meanwhile (``python -m load_test soak``).

Client kinds, each a closed loop (one request at a time) on its own keep-alive connection:

- ``small``: one text per request;
- ``big``: 1,024 texts per request (``--big-items``);
- ``mixed``: 1 to 1,024 texts of 2 to 256 words, drawn per request (the memory soak's mix),
  honouring Retry-After as ``polite`` clients do;
- ``retry``: one text, and on a 503 the same request again *at once* (a retry storm);
- ``reconnect``: as ``retry``, but each resend on a new connection (the 503's closed first),
  as clients whose retry opens a fresh connection do;
- ``polite``: one text, and on a 503 it waits what Retry-After says;
- ``slow``: opens a connection, sends half a request line, then one more byte every
  ``--slow-interval`` s (slowloris); reconnects when the server closes it;
- ``idle``: opens a connection and sends nothing; reconnects when the server closes it.

Every ``--window`` seconds it reads the server's process tree (``--server-pid``, automatic
with ``--start-server``): resident memory and open file descriptors; and per client kind the
200 answers per second (goodput), 503s per second and the p99 of 200 answers. It prints a
line per window, and writes ``soak.json`` and ``soak.png`` (RSS, file descriptors, goodput and
p99 over time). Like the rest of the tool it imports nothing from the server's code.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = ["KINDS", "Mix", "SoakResult", "mix_title", "plot_soak", "run_soak"]

KINDS = ("small", "big", "mixed", "retry", "reconnect", "polite", "slow", "idle")
#: The kinds that send requests (and so have answers, goodput and latency).
REQUESTING = ("small", "big", "mixed", "retry", "reconnect", "polite")
#: The kinds that resend a 503 at once.
STORMING = ("retry", "reconnect")

_WORDS = (
    "the quick brown fox jumps over a lazy dog while batching servers measure latency and "
    "memory under load with many clients sending texts of different lengths"
).split()


@dataclass(frozen=True, slots=True)
class Mix:
    """How many clients of each kind."""

    small: int = 16
    big: int = 1
    mixed: int = 0
    retry: int = 0
    reconnect: int = 0
    polite: int = 0
    slow: int = 0
    idle: int = 0
    big_items: int = 1024
    words: int = 12
    slow_interval: float = 5.0

    def counts(self) -> dict[str, int]:
        return {kind: int(getattr(self, kind)) for kind in KINDS}


@dataclass(slots=True)
class SoakResult:
    """Per-request records, per-window samples and the connections the slow kinds held."""

    records: list[tuple[str, float, int, float, int]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    slow_open: int = 0
    slow_reconnects: int = 0


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _request(host: str, texts: Sequence[str]) -> bytes:
    body = json.dumps({"inputs": list(texts)}).encode()
    head = (
        f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, dict[str, str], bytes]:
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def tree_fds(pid: int) -> int | None:
    """Open file descriptors of ``pid`` and its descendants, or None if unreadable."""
    try:
        root = psutil.Process(pid)
        total = root.num_fds()
        for child in root.children(recursive=True):
            try:
                total += child.num_fds()
            except psutil.Error:
                continue
        return total
    except (psutil.Error, AttributeError):
        return None


def tree_rss(pid: int) -> int | None:
    try:
        root = psutil.Process(pid)
        total = int(root.memory_info().rss)
        for child in root.children(recursive=True):
            try:
                total += int(child.memory_info().rss)
            except psutil.Error:
                continue
        return total
    except psutil.Error:
        return None


class _Soak:
    def __init__(
        self,
        host: str,
        port: int,
        mix: Mix,
        duration: float,
        window: float,
        server_pid: int | None,
        seed: int,
        timeout: float,
        on_window: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.host, self.port = host, port
        self.mix = mix
        self.duration = duration
        self.window = window
        self.server_pid = server_pid
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.on_window = on_window
        self.result = SoakResult()
        self.stop_at = 0.0
        self.slow_open = 0

    def _texts(self, kind: str) -> list[str]:
        words = self.mix.words
        if kind == "big":
            return [_sentence(self.rng, words) for _ in range(self.mix.big_items)]
        if kind == "mixed":
            count = self.rng.randint(1, 1024)
            return [_sentence(self.rng, self.rng.randint(2, 256)) for _ in range(count)]
        return [_sentence(self.rng, words)]

    async def requester(self, kind: str, index: int) -> None:
        loop = asyncio.get_running_loop()
        pool = [self._texts(kind) for _ in range(1 if kind == "big" else 8)]
        if kind == "mixed":
            pool = [self._texts(kind) for _ in range(16)]
        requests = [(_request(self.host, texts), len(texts)) for texts in pool]
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        turn = index
        while loop.time() < self.stop_at:
            request, items = requests[turn % len(requests)]
            turn += 1
            started = loop.time()
            while True:
                try:
                    if conn is None:
                        conn = await asyncio.open_connection(self.host, self.port)
                    status, headers, _ = await asyncio.wait_for(
                        _exchange(*conn, request), self.timeout
                    )
                    if headers.get("connection", "").lower() == "close":
                        conn[1].close()
                        conn = None
                except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                    status, headers = 0, {}
                    if conn is not None:
                        conn[1].close()
                    conn = None
                now = loop.time()
                self.result.records.append((kind, now, status, now - started, items))
                if status == 503 and kind in STORMING and now < self.stop_at:
                    started = now
                    if kind == "reconnect" and conn is not None:
                        conn[1].close()
                        conn = None
                    continue  # at once: the storm
                if status == 503 and kind in ("polite", "mixed"):
                    wait = float(headers.get("retry-after", "1") or 1)
                    await asyncio.sleep(min(wait, max(0.0, self.stop_at - now)))
                elif status == 0:
                    await asyncio.sleep(0.05)  # a refused connection: do not spin
                break
        if conn is not None:
            conn[1].close()

    async def lurker(self, kind: str) -> None:
        """A slow or idle connection; reconnects whenever the server closes it."""
        loop = asyncio.get_running_loop()
        line = f"POST / HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: 10\r\nX-Slow: "
        while loop.time() < self.stop_at:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.5)
                continue
            self.slow_open += 1
            try:
                if kind == "slow":
                    writer.write(line[: len(line) // 2].encode())
                while loop.time() < self.stop_at:
                    gap = self.mix.slow_interval if kind == "slow" else self.stop_at - loop.time()
                    try:
                        data = await asyncio.wait_for(reader.read(65536), max(0.01, gap))
                    except TimeoutError:
                        if kind == "slow":
                            writer.write(b"x")
                        continue
                    if not data:
                        break  # closed by the server
            except OSError:
                pass
            finally:
                self.slow_open -= 1
                writer.close()
            self.result.slow_reconnects += 1

    async def sampler(self) -> None:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        mark = 0
        last = begin
        while True:
            now = loop.time()
            sample: dict[str, Any] = {
                "t": round(now - begin, 3),
                "slow_connections": self.slow_open,
            }
            if self.server_pid is not None:
                rss = tree_rss(self.server_pid)
                sample["rss_mb"] = None if rss is None else round(rss / 2**20, 1)
                sample["fds"] = tree_fds(self.server_pid)
            self.result.samples.append(sample)
            if now > begin:
                window = self._window(self.result.records[mark:], now - last, now - begin)
                mark = len(self.result.records)
                last = now
                window.update(sample)
                self.result.windows.append(window)
                if self.on_window is not None:
                    self.on_window(window)
            if now >= self.stop_at:
                return
            await asyncio.sleep(min(self.window, max(0.0, self.stop_at - now)))

    def _window(
        self, records: list[tuple[str, float, int, float, int]], span: float, end: float
    ) -> dict[str, Any]:
        span = max(1e-9, span)
        out: dict[str, Any] = {"end": round(end, 3), "kinds": {}}
        total_ok = 0
        for kind in REQUESTING:
            mine = [r for r in records if r[0] == kind]
            if not mine:
                continue
            ok = [r for r in mine if r[2] == 200]
            total_ok += len(ok)
            p99 = _percentile([r[3] for r in ok], 99)
            out["kinds"][kind] = {
                "ok_per_s": round(len(ok) / span, 2),
                "items_per_s": round(sum(r[4] for r in ok) / span, 1),
                "refused_per_s": round(sum(1 for r in mine if r[2] == 503) / span, 2),
                "errors": sum(1 for r in mine if r[2] not in (200, 503)),
                "timeouts_per_s": round(sum(1 for r in mine if r[2] == 504) / span, 2),
                "p99_ms": None if p99 is None else round(1000 * p99, 1),
            }
        out["goodput_per_s"] = round(total_ok / span, 2)
        return out

    async def run(self) -> SoakResult:
        loop = asyncio.get_running_loop()
        self.result.started = time.time()
        self.stop_at = loop.time() + self.duration
        tasks = [loop.create_task(self.sampler())]
        counts = self.mix.counts()
        for kind in REQUESTING:
            tasks += [loop.create_task(self.requester(kind, i)) for i in range(counts[kind])]
        for kind in ("slow", "idle"):
            tasks += [loop.create_task(self.lurker(kind)) for _ in range(counts[kind])]
        await asyncio.gather(*tasks)
        self.result.ended = time.time()
        return self.result


def run_soak(
    url: str,
    mix: Mix,
    *,
    duration: float,
    window: float = 10.0,
    server_pid: int | None = None,
    seed: int = 0,
    timeout: float = 60.0,
    on_window: Callable[[dict[str, Any]], None] | None = None,
) -> SoakResult:
    """Run ``mix`` against ``url`` (``http://host:port``) for ``duration`` seconds."""
    rest = url.split("//", 1)[-1].rstrip("/")
    host, _, port = rest.partition(":")
    soak = _Soak(host, int(port or 80), mix, duration, window, server_pid, seed, timeout, on_window)
    return asyncio.run(soak.run())


def summary(result: SoakResult) -> dict[str, Any]:
    """Whole-run figures: per kind goodput and p99, RSS and file descriptors first/last/max."""
    span = max(1e-9, result.ended - result.started)
    kinds: dict[str, Any] = {}
    for kind in REQUESTING:
        mine = [r for r in result.records if r[0] == kind]
        if not mine:
            continue
        ok = [r for r in mine if r[2] == 200]
        p99 = _percentile([r[3] for r in ok], 99)
        kinds[kind] = {
            "requests": len(mine),
            "ok": len(ok),
            "refused": sum(1 for r in mine if r[2] == 503),
            "timed_out": sum(1 for r in mine if r[2] == 504),
            "errors": sum(1 for r in mine if r[2] not in (200, 503, 504)),
            "ok_per_s": round(len(ok) / span, 2),
            "items_per_s": round(sum(r[4] for r in ok) / span, 1),
            "p99_ms": None if p99 is None else round(1000 * p99, 1),
        }
    rss = [s["rss_mb"] for s in result.samples if s.get("rss_mb") is not None]
    fds = [s["fds"] for s in result.samples if s.get("fds") is not None]
    out: dict[str, Any] = {"seconds": round(span, 1), "kinds": kinds}
    if rss:
        out["rss_mb"] = {"first": rss[0], "last": rss[-1], "max": max(rss)}
    if fds:
        out["fds"] = {"first": fds[0], "last": fds[-1], "max": max(fds)}
    out["slow_reconnects"] = result.slow_reconnects
    return out


def format_window(window: dict[str, Any]) -> str:
    parts = [f"t={window['end']:7.1f}s", f"goodput {window['goodput_per_s']:8.1f}/s"]
    if window.get("rss_mb") is not None:
        parts.append(f"rss {window['rss_mb']:7.1f} MB")
    if window.get("fds") is not None:
        parts.append(f"fds {window['fds']:5d}")
    parts.append(f"slow conns {window['slow_connections']:5d}")
    for kind, figures in window["kinds"].items():
        p99 = figures["p99_ms"]
        parts.append(
            f"{kind}: {figures['ok_per_s']:.1f} ok/s {figures['refused_per_s']:.1f} 503/s "
            f"p99 {'-' if p99 is None else f'{p99:.0f} ms'}"
        )
    return " | ".join(parts)


def plot_soak(path: Path, windows: Sequence[dict[str, Any]], title: str = "soak") -> None:
    """Four panels over time: RSS, file descriptors, goodput per kind, p99 per kind."""
    import matplotlib

    from load_test.report import plain_log_axis

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [w["end"] for w in windows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True, layout="constrained")
    axes[0].plot(t, [w.get("rss_mb") or math.nan for w in windows], marker=".")
    axes[0].set_ylabel("RSS, process tree (MB)")
    axes[1].plot(t, [w.get("fds") or math.nan for w in windows], marker=".", label="server fds")
    axes[1].plot(t, [w["slow_connections"] for w in windows], label="slow/idle connections")
    axes[1].set_ylabel("count")
    axes[1].set_ylim(bottom=0)
    kinds = sorted({kind for w in windows for kind in w["kinds"]})
    p99s: list[float] = []
    for kind in kinds:
        axes[2].plot(
            t, [w["kinds"].get(kind, {}).get("ok_per_s", math.nan) for w in windows], label=kind
        )
        p99 = [w["kinds"].get(kind, {}).get("p99_ms") or math.nan for w in windows]
        p99s += [v for v in p99 if not math.isnan(v)]
        axes[3].plot(t, p99, label=kind)
    axes[2].plot(t, [w["goodput_per_s"] for w in windows], "k--", label="all")
    axes[2].set_ylabel("200 answers/s")
    axes[2].set_ylim(bottom=0)
    axes[3].set_ylabel("p99 of 200s (ms)")
    axes[3].set_yscale("log")
    plain_log_axis(axes[3], "y", p99s, length_in=2.2)
    axes[3].set_xlabel("seconds")
    for ax in axes:
        ax.grid(alpha=0.3)
    # Beside the panels, not over their lines.
    for ax in axes[1:] if kinds else axes[1:3]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9, frameon=False)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def mix_title(counts: dict[str, int], duration_s: float | None = None) -> str:
    """``soak: 16 small, 1 big, 64 retry clients; 500 slow, 500 idle connections, 600 s``."""
    clients = [f"{n} {kind}" for kind, n in counts.items() if n and kind not in ("slow", "idle")]
    connections = [f"{counts[kind]} {kind}" for kind in ("slow", "idle") if counts.get(kind)]
    parts = []
    if clients:
        parts.append(", ".join(clients) + " clients")
    if connections:
        parts.append(", ".join(connections) + " connections")
    title = "soak: " + "; ".join(parts or ["no clients"])
    return title + (f", {duration_s:g} s" if duration_s else "")


# ---------------------------------------------------------------------------- command line


def add_parser(sub: Any) -> None:
    """Register ``soak`` on the tool's subcommands."""
    p = sub.add_parser(
        "soak",
        help="a mix of small, big, retrying, slow and idle clients for a long time: RSS, "
        "file descriptors, goodput and p99 per window",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--url", help="server base URL (default: start one, see --start-server)")
    p.add_argument(
        "--start-server",
        action="store_true",
        help="start `python server.py` (with --server-arg flags) instead of using --url",
    )
    p.add_argument(
        "--server-arg", action="append", default=[], metavar="ARG", help="server flag, repeatable"
    )
    p.add_argument("--server-dir", type=Path, default=Path("."), help="server's working directory")
    p.add_argument("--server-pid", type=int, help="pid whose process tree is measured")
    p.add_argument("-d", "--duration", type=float, default=600.0, help="seconds (600)")
    p.add_argument("--window", type=float, default=10.0, help="seconds per report window (10)")
    for kind, default, what in (
        ("small", 16, "one-text clients"),
        ("big", 1, "clients sending --big-items texts per request"),
        ("mixed", 0, "clients sending 1-1,024 texts of 2-256 words"),
        ("retry", 0, "one-text clients that retry a 503 at once"),
        ("reconnect", 0, "one-text clients that retry a 503 at once on a new connection"),
        ("polite", 0, "one-text clients that wait Retry-After on a 503"),
        ("slow", 0, "slowloris connections (half a request line, a byte every interval)"),
        ("idle", 0, "connections that send nothing"),
    ):
        p.add_argument(f"--{kind}", type=int, default=default, help=f"{what} ({default})")
    p.add_argument("--big-items", type=int, default=1024, help="texts per big request (1024)")
    p.add_argument("--words", type=int, default=12, help="words per text of small clients (12)")
    p.add_argument("--slow-interval", type=float, default=5.0, help="slowloris byte gap, s (5)")
    p.add_argument("--timeout", type=float, default=60.0, help="client timeout per request, s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help="default: load_test_results/soak-<time>")
    p.add_argument("--no-plots", action="store_true", help="skip soak.png")


def mix_of(args: Any) -> Mix:
    return Mix(
        small=args.small,
        big=args.big,
        mixed=args.mixed,
        retry=args.retry,
        reconnect=args.reconnect,
        polite=args.polite,
        slow=args.slow,
        idle=args.idle,
        big_items=args.big_items,
        words=args.words,
        slow_interval=args.slow_interval,
    )


def cmd_soak(args: Any) -> int:
    import contextlib
    import datetime as dt

    from load_test.serverproc import ServerProcess

    out: Path = args.out_dir or Path("load_test_results") / (
        "soak-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    )
    out.mkdir(parents=True, exist_ok=True)
    mix = mix_of(args)
    with contextlib.ExitStack() as stack:
        if args.start_server or not args.url:
            server = stack.enter_context(
                ServerProcess(
                    args.server_arg, cwd=args.server_dir, log_path=out / "server-soak.log"
                )
            )
            url, pid = server.url, server.pid
        else:
            from load_test.client import Target
            from load_test.reach import check_reachable

            check_reachable(Target.parse(args.url))
            url, pid = args.url, args.server_pid
        print(f"soak: {url} for {args.duration:.0f} s, clients {mix.counts()}", flush=True)
        result = run_soak(
            url,
            mix,
            duration=args.duration,
            window=args.window,
            server_pid=pid,
            seed=args.seed,
            timeout=args.timeout,
            on_window=lambda window: print(format_window(window), flush=True),
        )
    doc = {
        "command": "soak",
        "url": url,
        "mix": mix.counts(),
        "duration_s": args.duration,
        "summary": summary(result),
        "windows": result.windows,
    }
    (out / "soak.json").write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc["summary"], indent=2))
    files = [str(out / "soak.json")]
    if not args.no_plots and result.windows:
        plot_soak(out / "soak.png", result.windows, mix_title(mix.counts(), args.duration))
        files.append(str(out / "soak.png"))
    print(f"files: {', '.join(files)}")
    return 0
