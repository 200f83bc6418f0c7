"""Every command in README.md and docs/**/*.md, run as a new user would run it.

The commands are discovered, not listed: every fenced block of those files is read, and each
command of a ``bash``/``sh``/``shell`` block, or each ``$ `` line of a ``console`` block, must
match one rule of ``RULES`` below, which says how it is run or why it is not. A block without a
language, a command that no rule matches and a rule that matches nothing all fail
``test_every_documented_command_is_accounted_for``, so a new command in the docs is either run
here or listed with its reason.

How they run (``test_documented_command``, one test per command):

- In a copy of the work tree (a clone: tracked and untracked files, not ignored ones), with a
  fresh virtual environment built by the README's own install command (the part of quick start
  command 1 before ``&&``), reused by every command of the module.
- Only the extras a command's line names (a comment ``# needs the [loadtest] extra``) are
  installed, the way the README says (``python scripts/install.py loadtest``), before it runs.
  The commands that name none run first, before any extra is there, so one that needs an extra
  its line does not name fails.
- Against a real server started as quick start command 1 starts it (``python server.py``).
  Servers run in the clone, which also holds what the docs ask the reader to bring: stand-ins
  for their model folders (tiny random BERTs), ``examples/mypackage`` (docs/models.md),
  docs/model-repository.md's complete ``config.toml`` as ``models/minilm/config.toml``, and a
  one-model ``models.toml``.
- Ports: servers get free ports through ``BATCHING_PORT`` and ``BATCHING_GRPC_PORT`` (every
  flag's documented twin); in a client command ``127.0.0.1:8000`` and ``127.0.0.1:8001`` become
  that server's ports. Every other change to a command is in its rule's ``rewrite`` pairs
  (shorter durations, fewer levels), applied as plain text replacements that must each match.
- A command is run with ``bash -euo pipefail -c``: its exit status must be 0; a ``console``
  command's output must have the documented shape (same keys and strings, lists at least as long
  as shown, ``...N floats...`` exactly N numbers); a server command must become ready, answer a
  request, and end on SIGTERM (status 0, or the SIGTERM uvicorn raises again after draining).
- ``NAME=value`` lines carry over to the later commands of the same file, as in one shell.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
#: Blocks that hold code, configuration or output, not commands.
NOT_COMMANDS = {"python", "toml", "json", "text", "yaml", "promql"}
#: "needs the [loadtest] extra", "needs the [loadtest] and [ray] extras"
EXTRA = re.compile(r"needs the ((?:\[\w+\](?:,? and |, )?)+) extras?\b")
INSTALL_EXTRA = "python scripts/install.py {}"
#: The ports the docs use, and what they become.
DOC_HTTP, DOC_GRPC = "127.0.0.1:8000", "127.0.0.1:8001"
SAMPLE = b"the cat sat on the mat"

# How each command is run. ``how``:
#   quickstart  quick start command 1: its install built the venv, its server is the one the
#               client commands use (the ``main_server`` fixture)
#   server      a server that runs until stopped: start it, wait for ready, one request, SIGTERM
#   client      run it against the main server; exit status 0 (console: and the output's shape)
#   setup       run it once (an installer), exit status 0
#   env         a NAME=value line: carried over to the file's later commands
#   flags       not run (a benchmark: minutes of load to produce the figures the docs give);
#               ``<program> --help`` must exit 0 and list every flag the command uses
#   skip        not run here, for ``why``
PERF_SHORT = (
    # docs/perf-analyzer.md's advice for a busy shared machine, with more windows to settle in
    ("scripts/perf_analyzer ", "scripts/perf_analyzer --measurement-interval 1000 -s 100 -r 20 "),
)


@dataclass(frozen=True)
class Rule:
    pattern: str
    how: str
    why: str = ""
    rewrite: tuple[tuple[str, str], ...] = ()
    #: server: files the command's working directory needs (see ``prepare``)
    needs: str = ""


RULES: tuple[Rule, ...] = (
    Rule(r"python scripts/install\.py && python server\.py$", "quickstart"),
    Rule(
        r"git clone <repository-url> batching && cd batching$",
        "skip",
        "the clone: these tests run in a copy of the work tree",
    ),
    # README quick start: the openai SDK, then its example against the quick start's server.
    Rule(r"pip install openai$", "setup"),
    Rule(
        r"python examples/openai_embeddings\.py$",
        "client",
        # Examples take the server's URL from SERVER_URL (default http://127.0.0.1:8000).
        rewrite=(("python examples/", "SERVER_URL=http://127.0.0.1:{http} python examples/"),),
    ),
    Rule(
        r"MODEL=gpt2 python examples/openai_streaming\.py$",
        "skip",
        "asks a GPT-2 the quick start does not serve: tests/test_examples.py runs this example "
        "against a served tiny GPT-2",
    ),
    Rule(
        r"python server\.py --model (BAAI|openai-community|distilbert)/",
        "skip",
        "a model of the Hugging Face Hub, which these tests never reach: "
        "tests/models/test_hub_models.py serves a hub id from a local stand-in for the hub's "
        "download API",
    ),
    Rule(
        r"hf download BAAI/bge-small-en-v1\.5 --local-dir \./bge-small-en-v1\.5$",
        "skip",
        "downloads from the Hugging Face Hub, which these tests never reach",
    ),
    Rule(
        r"python server\.py --model \./bge-small-en-v1\.5$",
        "skip",
        "serves the folder the hf download above fetches; tests/models/test_hub_models.py serves "
        "one from the Hugging Face cache",
    ),
    Rule(
        r"python scripts/install\.py test && python -m pytest$",
        "skip",
        "this suite itself: .ci/run runs this very command (the install, then every test)",
    ),
    Rule(r"python server\.py$", "quickstart"),  # docs/perf-analyzer.md: the same server
    *(
        Rule(
            pattern,
            "skip",
            "README's TLS example (certificates, a TLS server, curl --cacert): "
            "tests/test_tls.py runs the block itself",
        )
        for pattern in (r"openssl ", r"python server\.py --ssl-certfile ", r"curl --cacert ")
    ),
    *(
        Rule(
            pattern,
            "skip",
            "README's speech example needs a real speech model and a recording: "
            "tests/models/audio/test_audio_doors.py serves tiny ones and sends WAV bodies on "
            "every door",
        )
        for pattern in (
            r"python server\.py --model \./wav2vec2-base-960h ",
            r"curl -s localhost:8000/ -H \"Content-Type: audio/wav\" --data-binary @speech\.wav$",
        )
    ),
    Rule(
        r"curl .*/v2/repository/models/",
        "skip",
        "load and unload answer 400 on the docs' server (--model-control-mode none); "
        "tests/control/test_model_control_server.py loads, reloads and unloads with tritonclient "
        "over HTTP and gRPC, tests/control/test_model_control.py with these routes",
    ),
    Rule(
        r"curl -s 127\.0\.0\.1:8000/models/my-",
        "skip",
        "README's task examples ask models the quick start does not serve: "
        "tests/models/text/test_text_tasks.py sends each of these bodies to a served model of "
        "its task",
    ),
    Rule(
        r"curl -sN? 127\.0\.0\.1:8000/(v1/(chat/)?completions|v2/models/my-gpt2/generate)",
        "skip",
        "README's streaming examples ask generating models the quick start does not serve: "
        "tests/models/generation/test_streaming_doors.py and "
        "tests/models/generation/test_seq2seq_streaming.py send these bodies "
        "to served ones",
    ),
    Rule(r"curl ", "client"),
    # docs/access.md, "API keys, CORS and the metrics port": a key file, and a server that asks
    # for it.
    Rule(r"printf 'sk-first\\nsk-second\\n' > api-keys && chmod 600 api-keys$", "setup"),
    Rule(
        r"python server\.py --api-key-file api-keys --metrics-port 9090$",
        "flags",
        "the generic server check sends no key; tests/deployment/test_auth_server.py serves with "
        "keys and --metrics-port, and calls it with curl, tritonclient and the openai SDK",
    ),
    Rule(r"[A-Z_]+=\S+$", "env"),
    Rule(r"bash scripts/install-perf-analyzer\.sh", "setup"),
    Rule(r"scripts/perf_analyzer --version", "client"),
    Rule(
        r"scripts/perf_analyzer .*--concurrency-range 1:64:8",
        "client",
        rewrite=(("--concurrency-range 1:64:8", "--concurrency-range 1:2:1"), *PERF_SHORT),
    ),
    Rule(
        r"scripts/perf_analyzer .*--concurrency-range 1:8:1",
        "client",
        rewrite=(("--concurrency-range 1:8:1", "--concurrency-range 1:2:1"), *PERF_SHORT),
    ),
    Rule(r"for c in 1 16 64 256; do", "client", rewrite=(("1 16 64 256", "1 2"), *PERF_SHORT)),
    Rule(
        r"scripts/perf_analyzer .*--request-rate-range 50:300:50",
        "client",
        rewrite=(
            ("50:300:50", "20:40:20"),  # rates a busy 2-core machine keeps up with
            ("--measurement-interval 5000", "--measurement-interval 1000"),
            *PERF_SHORT,
        ),
    ),
    Rule(r"scripts/perf_analyzer ", "client", rewrite=PERF_SHORT),
    Rule(r"python server\.py --model \./my-", "server", needs="model folders"),
    Rule(r"python server\.py --model mypackage\.models:Reverser$", "server", needs="mypackage"),
    Rule(r"python server\.py( --(instances|instance-kind|engine|precision) \S+)+$", "server"),
    Rule(r"python server\.py --device cuda", "skip", "needs GPUs: none on this machine"),
    Rule(r"python server\.py --model-repository models/$", "server", needs="models/"),
    Rule(
        r"python server\.py --model-repository models/ --model-control-mode explicit$",
        "server",
        needs="models/",
    ),
    Rule(r"python server\.py --model-repository models\.toml$", "server", needs="models.toml"),
    Rule(
        r"python -m load_test run --url http://127\.0\.0\.1:8000 -c 16 -d 10 --items 1-6$",
        "client",
        rewrite=(("-d 10 ", "-d 2 "),),
    ),
    Rule(
        r"python -m load_test run --url http://127\.0\.0\.1:8000 --rate 200 -d 30$",
        "client",
        rewrite=(("-d 30", "-d 2"),),
    ),
    Rule(
        r"python -m load_test tune --p99-ms 100 --items 1-6$",
        "client",
        rewrite=(
            # A short search on a machine the other tests share: a goal it can meet.
            ("--p99-ms 100", "--p99-ms 5000"),
            (
                "--items 1-6",
                "--items 1-6 --max-batch-sizes 8 --delays-ms 2 --instances 1 --levels 1,2"
                " -d 1 --refine 0 --confirm-s 0 --verify-s 0",
            ),
        ),
    ),
    Rule(
        r"python -m load_test\.overload ",
        "flags",
        "a stress run judged on latency targets (503 p99 < 10 ms): on the shared test machine "
        "a short run measures the machine; tests/loadtest runs the tool",
    ),
    Rule(
        r"python -m load_test soak --start-server -d 600 ",
        "client",
        rewrite=(
            ("-d 600", "-d 4 --window 2"),
            ("--retry 64 --slow 500 --idle 500", "--retry 4 --slow 20 --idle 20"),
        ),
    ),
    Rule(r"python benchmarks/\w+\.py", "flags", "a benchmark: the docs' figures come from it"),
    Rule(
        r"python -m load_test (triton-batching|concurrency-sweep|tune --p99-ms 100 --items "
        r"1-6 --max-batch-sizes)",
        "flags",
        "a benchmark: the docs' figures come from it",
    ),
    Rule(
        r"python -m load_test run --url http://127\.0\.0\.1:8000 --api openai-completions ",
        "flags",
        "a load on a text-generation model the quick start does not serve: "
        "tests/models/generation/test_streaming_doors.py runs the tool's streamed generation "
        "against one",
    ),
    Rule(
        r"sudo apt-get install -y haproxy",
        "skip",
        "installs a Debian package as root with sudo; .ci/run installs haproxy with apt-get",
    ),
    Rule(
        r"deploy/haproxy/run\.sh --replicas 2 --port 8000 ",
        "server",
        rewrite=(("--port 8000", "--port {http}"),),
        needs="port range",
    ),
    Rule(
        r"kubectl apply ",
        "skip",
        "no Kubernetes cluster here; tests/deployment/test_kubernetes.py validates the manifests",
    ),
    Rule(r"docker build ", "skip", "no container engine here; tests/deployment/test_dockerfile.py"),
    # docs/tracing.md and README, "Traces": a server that sends traces to a collector (none
    # listens here: it must still serve, and stop without waiting for one).
    Rule(
        r"docker run --rm -p 16686:16686 -p 4317:4317 -p 4318:4318 jaegertracing",
        "skip",
        "no container engine here; tests/tracing/test_tracing.py exports to OTLP receivers it runs",
    ),
    Rule(r"python server\.py --otlp-endpoint \S+( --trace-rate [0-9.]+)?$", "server"),
    Rule(
        r"python scripts/install\.py ray$|serve run batching\.ray:build_app",
        "skip",
        "serve run starts Ray's proxy on port 8000 of every interface (Ray 2.60: no flag or "
        "variable moves it) and tests bind 127.0.0.1 only; tests/deployment/test_ray.py serves "
        "batching.ray:build_app on a local Ray cluster with the proxy on 127.0.0.1",
    ),
)


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    lang: str
    text: str
    comment: str
    #: console blocks: the answer documented under the command
    output: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    lines: list[str] = field(default_factory=list)


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    current: Block | None = None
    fence = ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if current is None:
            opened = re.match(r"(```+|~~~+)\s*([\w+-]*)", stripped)
            if opened:
                fence = opened.group(1)
                current = Block(str(path.relative_to(ROOT)), number, opened.group(2).lower())
        elif stripped.startswith(fence) and not stripped.strip(fence[0]):
            found.append(current)
            current = None
        else:
            current.lines.append(line)
    assert current is None, f"{path}: a block opened at line {current.line} is never closed"
    return found


def split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its trailing ``# comment`` (quotes respected)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def commands(block: Block) -> list[Command]:
    """Logical commands: continuation lines joined by a space, the lines of a ``for``/``while``/
    ``if`` up to its end by a newline; in a console block, each ``$ `` line and its answer."""
    found: list[Command] = []
    pieces: list[str] = []  # the command's lines so far (continuations joined)
    comments: list[str] = []
    start = depth = 0
    continues = False
    for offset, raw in enumerate(block.lines, 1):
        if block.lang == "console" and not pieces:
            if not raw.startswith("$ "):
                if found:  # the documented answer of the command above
                    found[-1] = dataclasses.replace(found[-1], output=(*found[-1].output, raw))
                continue
            raw = raw[2:]
        text, comment = split_comment(raw)
        text = text.strip()
        if not pieces and not text:
            continue  # a blank or comment line
        if comment:
            comments.append(comment)
        if not pieces:
            start = block.line + offset
        line = text[:-1].rstrip() if text.endswith("\\") else text
        if continues:
            pieces[-1] += " " + line
        else:
            pieces.append(line)
            words = line.split()
            depth += words[0] in {"for", "while", "if"}
            depth -= words[0] in {"done", "fi"} or line.endswith(("; done", "; fi"))
        continues = text.endswith("\\")
        if continues or depth > 0:
            continue
        text = "\n".join(pieces)
        found.append(Command(block.doc, start, block.lang, text, "; ".join(comments)))
        pieces, comments = [], []
    assert not pieces, f"{block.doc}:{block.line}: a command continues past its block"
    return found


def documented() -> tuple[list[Block], list[Command]]:
    every = [block for path in DOCS for block in blocks(path)]
    return every, [c for block in every if block.lang in SHELL for c in commands(block)]


def extras_of(command: Command) -> list[str]:
    """The extras the command's line says it needs."""
    return [
        name for found in EXTRA.findall(command.comment) for name in re.findall(r"\[(\w+)\]", found)
    ]


def rule_for(command: Command) -> Rule | None:
    return next((rule for rule in RULES if re.match(rule.pattern, command.text)), None)


BLOCKS, COMMANDS = documented()


def test_every_documented_command_is_accounted_for() -> None:
    unlabelled = [f"{b.doc}:{b.line}" for b in BLOCKS if not b.lang]
    assert not unlabelled, (
        f"fenced blocks without a language (bash, console, text, ...): {unlabelled}"
    )
    unknown = sorted(
        {f"{b.doc}:{b.line} ({b.lang})" for b in BLOCKS}
        - {f"{b.doc}:{b.line} ({b.lang})" for b in BLOCKS if b.lang in SHELL | NOT_COMMANDS}
    )
    assert not unknown, f"blocks of a language this test does not know: {unknown}"
    assert COMMANDS, "no command found in the docs"
    unmatched = [f"{c.where}: {c.text}" for c in COMMANDS if rule_for(c) is None]
    assert not unmatched, "documented commands no rule runs or excuses:\n" + "\n".join(unmatched)
    used = {rule_for(c) for c in COMMANDS}
    stale = [rule.pattern for rule in RULES if rule not in used]
    assert not stale, f"rules that match no documented command any more: {stale}"
    for rule in RULES:
        assert rule.how in {"quickstart", "server", "client", "setup", "env", "flags", "skip"}
        assert (rule.how in {"skip", "flags"}) == bool(rule.why), rule.pattern


def test_every_extra_a_line_names_exists() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for command in COMMANDS:
        for name in extras_of(command):
            assert name in extras, f"{command.where}: no extra [{name}] in pyproject.toml"


# -- running them ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it (the fleet uses PORT .. PORT+2N)."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        taken = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                taken.append(probe)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in taken:
                probe.close()
    raise AssertionError(f"no {count} consecutive free ports")


def get(url: str, data: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, data=data, timeout=timeout) as answer:
            return int(answer.status), bytes(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    """Poll ``url`` until it answers 200, the process exits, or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"exited with {process.returncode} before it was ready:\n{tail(log)}"
            )
        try:
            if get(url, timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)  # polling a port with a deadline
    raise AssertionError(f"not ready at {url} after {timeout:.0f} s:\n{tail(log)}")


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop(process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise AssertionError(
                f"still running {timeout:.0f} s after SIGTERM:\n{tail(log)}"
            ) from None
    return int(process.returncode)


@dataclass
class Workspace:
    """The clone, its virtual environment, and how to run a command in it."""

    clone: Path
    venv: Path
    logs: Path
    extras: set[str] = field(default_factory=set)

    def env(self, extra: Mapping[str, str]) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
            and not key.startswith(("BATCHING_", "PYTEST_"))
        }
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        perf_analyzer = ROOT / ".venv-pa"
        if perf_analyzer.is_dir():  # installed by .ci/run; the clone has no ignored files
            env.setdefault("PERF_ANALYZER_VENV", str(perf_analyzer))
        env.update(extra)
        return env

    def run(
        self,
        script: str,
        *,
        timeout: float = 300.0,
        cwd: Path | None = None,
        env: Mapping[str, str] = MappingProxyType({}),
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=cwd or self.clone,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(
        self,
        script: str,
        log: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] = MappingProxyType({}),
    ) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", f"exec {script}"],
                cwd=cwd or self.clone,
                env=self.env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def install_extras(self, command: Command) -> None:
        for name in extras_of(command):
            if name not in self.extras:
                install = INSTALL_EXTRA.format(name)
                done = self.run(install, timeout=600)
                assert done.returncode == 0, f"{install}:\n{done.stdout[-3000:]}{done.stderr}"
                self.extras.add(name)


def quick_start() -> tuple[str, str]:
    """README quick start command 1, as (its install, its server)."""
    (first,) = [c for c in COMMANDS if c.doc == "README.md" and rule_for(c) == RULES[0]]
    install, serve = (part.strip() for part in first.text.split("&&"))
    return install, serve


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    base = tmp_path_factory.mktemp("docs")
    clone = base / "clone"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in listed)):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    space = Workspace(clone, venv, base / "logs")
    space.logs.mkdir()
    install, _ = quick_start()
    done = space.run(install, timeout=600)
    assert done.returncode == 0, f"{install}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "torch 2.13.0+cpu" in done.stderr or "torch==2.13.0+cpu" in done.stderr
    return space


@dataclass(frozen=True)
class Server:
    http: int
    grpc: int
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def main_server(workspace: Workspace) -> Iterator[Server]:
    _, serve = quick_start()
    http, grpc = free_port(), free_port()
    log = workspace.logs / "main-server.log"
    process = workspace.start(
        serve, log, env={"BATCHING_PORT": str(http), "BATCHING_GRPC_PORT": str(grpc)}
    )
    try:
        wait_ready(process, f"http://127.0.0.1:{http}/v2/health/ready", log, 180)
        yield Server(http, grpc, process)
    finally:
        stop(process, log)


def rewritten(command: Command, rule: Rule, **ports: int) -> str:
    text = command.text
    for old, new in rule.rewrite:
        assert old in text, f"{command.where}: rewrite {old!r} no longer matches {text!r}"
        text = text.replace(old, new.format(**ports))
    if "http" in ports:
        text = text.replace(DOC_HTTP, f"127.0.0.1:{ports['http']}")
    if "grpc" in ports:
        text = text.replace(DOC_GRPC, f"127.0.0.1:{ports['grpc']}")
    return text


def earlier_assignments(command: Command) -> dict[str, str]:
    """``NAME=value`` commands above this one in the same file."""
    found: dict[str, str] = {}
    for other in COMMANDS:
        if other.doc == command.doc and other.line < command.line:
            rule = rule_for(other)
            if rule is not None and rule.how == "env":
                name, _, value = other.text.partition("=")
                found[name] = value
    return found


ELLIPSIS = "__more__"


def doc_shape(lines: tuple[str, ...]) -> Any:
    """The documented answer as JSON, ``...N floats...`` as N numbers and ``...`` as 'more'."""
    text = " ".join(lines)
    text = re.sub(r"\.\.\.(\d+) floats\.\.\.", lambda m: f'"__{m.group(1)}_numbers__"', text)
    text = text.replace("...", f'"{ELLIPSIS}"')
    return json.loads(text)


def same_shape(doc: Any, real: Any, where: str = "answer") -> None:
    if isinstance(doc, dict):
        assert isinstance(real, dict) and set(real) == set(doc), f"{where}: {real!r} vs {doc!r}"
        for key in doc:
            same_shape(doc[key], real[key], f"{where}.{key}")
    elif isinstance(doc, list):
        assert isinstance(real, list), f"{where}: {real!r} is not a list"
        counted = [d for d in doc if isinstance(d, str) and re.fullmatch(r"__\d+_numbers__", d)]
        if counted:
            (marker,) = counted
            size = int(marker.strip("_").split("_")[0])
            assert len(real) == size, f"{where}: {len(real)} items, documented {size}"
            assert all(isinstance(x, float | int) for x in real), where
            return
        shown = [d for d in doc if d != ELLIPSIS]
        if ELLIPSIS in doc:
            assert len(real) >= len(shown), f"{where}: {len(real)} items, at least {len(shown)}"
        else:
            assert len(real) == len(shown), f"{where}: {len(real)} items, documented {len(shown)}"
        for i, item in enumerate(shown):
            same_shape(item, real[i], f"{where}[{i}]")
    elif isinstance(doc, str):
        assert real == doc, f"{where}: {real!r}, documented {doc!r}"
    elif isinstance(doc, bool) or doc is None:
        assert real == doc, f"{where}: {real!r}, documented {doc!r}"
    else:
        assert isinstance(real, float | int) and not isinstance(real, bool), f"{where}: {real!r}"


def prepare(rule: Rule, workspace: Workspace, where: Path) -> None:
    """What a server command's working directory holds, as the docs describe it."""
    where.mkdir(parents=True, exist_ok=True)
    if rule.needs == "model folders" and not (where / "my-bert").is_dir():
        # Stand-ins for the reader's own folders: tiny random BERTs of each kind, built here.
        script = (
            "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
            "import transformers; from tests.support import tiny, tiny_tasks; root = Path('.'); "
            "tiny.classifier_folder(root, 'my-classifier', ['negative', 'positive']); "
            "tiny.encoder_folder(root, 'my-encoder'); "
            "tiny.sentence_folder(root, 'my-sentence-model'); "
            "tiny_tasks.token_classifier_folder(root, 'my-tagger'); "
            "tiny.classifier_folder(root, 'my-nli-model', "
            "['contradiction', 'neutral', 'entailment']); "
            "bert = tiny.encoder_folder(root, 'my-bert'); "
            "transformers.BertForMaskedLM(tiny.bert_config()).save_pretrained(bert); "
            "from tests.support import generators; generators.gpt2_folder(root, 'my-gpt2'); "
            "generators.t5_folder(root, 'my-t5'); "
            "from tests.support import vision; vision.classifier_folder(root, 'my-vit'); "
            "vision.clip_folder(root, 'my-clip')"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(ROOT)],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    elif rule.needs == "mypackage":
        # docs/models.md's example package, examples/mypackage, in the directory the server
        # starts in.
        shutil.copytree(ROOT / "examples" / "mypackage", where / "mypackage", dirs_exist_ok=True)
    elif rule.needs == "models/":
        # docs/model-repository.md's complete config.toml, as models/minilm/config.toml.
        (config,) = [
            b
            for b in BLOCKS
            if b.doc == "docs/model-repository.md"
            and b.lang == "toml"
            and b.lines[0].startswith('name = "minilm"')
        ]
        (where / "models" / "minilm").mkdir(parents=True, exist_ok=True)
        (where / "models" / "minilm" / "config.toml").write_text("\n".join(config.lines) + "\n")
    elif rule.needs == "models.toml":
        (where / "models.toml").write_text('[models.minilm]\nsource = "default"\n')


def png() -> bytes:
    """A small image, as the reader's cat.png stands for."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 120, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


def server_answers(command: Command, http: int) -> None:
    sample = b"the cat [MASK] on the mat" if "fill-mask" in command.text else SAMPLE
    if "zero-shot-classification" in command.text:
        labels = {"candidate_labels": ["animals", "sports"]}
        sample = json.dumps({"inputs": [sample.decode()], "parameters": labels}).encode()
    if "image-classification" in command.text:
        sample = json.dumps({"inputs": [base64.b64encode(png()).decode()]}).encode()
    status, body = get(f"http://127.0.0.1:{http}/", data=sample, timeout=60)
    assert status == 200, f"{command.where}: POST / answered {status}: {body[:300]!r}"
    answer = json.loads(body)
    assert len(answer["outputs"]) == 1, answer
    if "Reverser" in command.text:
        assert answer["outputs"] == [sample.decode()[::-1]]


def run_server(command: Command, rule: Rule, workspace: Workspace) -> None:
    where = workspace.clone  # the reader's folders sit in their clone, beside server.py
    prepare(rule, workspace, where)
    if rule.needs == "port range":  # deploy/haproxy/run.sh: PORT, PORT+i, PORT+N+i
        http = free_ports(5)
        grpc = http + 3
    else:
        http, grpc = free_port(), free_port()
    text = rewritten(command, rule, http=http, grpc=grpc)
    log = workspace.logs / f"server-{command.doc.replace('/', '-')}-{command.line}.log"
    # The fleet script gives each replica its ports itself.
    ports = (
        {}
        if rule.needs == "port range"
        else {"BATCHING_PORT": str(http), "BATCHING_GRPC_PORT": str(grpc)}
    )
    process = workspace.start(text, log, cwd=where, env=ports)
    try:
        wait_ready(process, f"http://127.0.0.1:{http}/v2/health/ready", log, 240)
        server_answers(command, http)
    finally:
        code = stop(process, log)
    # uvicorn ends a graceful shutdown by raising the signal again (as
    # tests/deployment/test_shutdown.py)
    assert code in (0, -signal.SIGTERM), f"{command.where}: exit {code} on SIGTERM:\n{tail(log)}"


def run_flags(command: Command, workspace: Workspace) -> None:
    words = shlex.split(command.text)
    program = []
    for word in words:
        if word.startswith("-") and word != "-m":
            break
        program.append(word)
    if program[-1] == "-m":  # python -m load_test.overload --factor ...
        program.append(words[len(program)])
    used = {w.split("=")[0] for w in words[: words.index("--") if "--" in words else None]}
    flags = sorted(w for w in used if w.startswith("-") and w not in {"-m", "--"})
    done = workspace.run(shlex.join([*program, "--help"]), timeout=120)
    assert done.returncode == 0, f"{shlex.join(program)} --help:\n{done.stderr[-3000:]}"
    missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){flag}(?![\w-])", done.stdout)]
    assert not missing, f"{command.where}: flags its --help does not list: {missing}"


# Commands whose line names no extra run first, before any extra is in the venv, so that one
# that needs an extra without saying so fails.
RUN = sorted(
    (c for c in COMMANDS if (r := rule_for(c)) is not None and r.how not in {"skip", "env"}),
    key=lambda c: bool(extras_of(c)),
)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", RUN, ids=[f"{c.where} {c.text[:60]}" for c in RUN])
def test_documented_command(
    command: Command, workspace: Workspace, request: pytest.FixtureRequest
) -> None:
    rule = rule_for(command)
    assert rule is not None
    workspace.install_extras(command)
    if rule.how == "quickstart":
        server: Server = request.getfixturevalue("main_server")
        assert server.process.poll() is None
        assert get(f"http://127.0.0.1:{server.http}/v2/health/ready")[0] == 200
        return
    if rule.how == "server":
        run_server(command, rule, workspace)
        return
    if rule.how == "flags":
        run_flags(command, workspace)
        return
    env = earlier_assignments(command)
    if rule.how == "client":
        server = request.getfixturevalue("main_server")
        text = rewritten(command, rule, http=server.http, grpc=server.grpc)
    else:  # setup
        text = rewritten(command, rule)
    done = workspace.run(text, timeout=600, env=env)
    assert done.returncode == 0, (
        f"{command.where}: exit status {done.returncode}\n$ {text}\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    if command.output:
        same_shape(doc_shape(command.output), json.loads(done.stdout))
    version = re.match(r"(Perf Analyzer Version [\d.]+)", command.comment)
    if version:
        assert version.group(1) in done.stdout + done.stderr
