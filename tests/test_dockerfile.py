"""The Dockerfile: no container engine runs here, so what can be checked without building it
is checked: its install commands are the README's, and its start command is the server's."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from batching.settings.cli import DEFAULT_GRPC_PORT, build_parser
from tests.support.manifests import of_kind

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
README = (ROOT / "README.md").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def the(keyword: str) -> list[str]:
    return [rest for found, rest in instructions() if found == keyword]


def test_its_pip_commands_are_the_readmes() -> None:
    pins = set(re.findall(r'"torch==([0-9.]+)"', README))
    assert len(pins) == 1, pins
    (pin,) = pins
    readme_install = f'pip install "torch=={pin}" -e .'
    assert readme_install in README
    # The README's CPU advice: the GPU command with the CPU index in place of the CUDA one.
    gpu_index = re.search(r"https://download\.pytorch\.org/whl/cu[0-9]+", README)
    assert gpu_index is not None and ".../whl/cpu" in README
    cpu_index = re.sub(r"/cu[0-9]+$", "/cpu", gpu_index.group(0))
    commands = [
        " ".join(command.split())
        for run in the("RUN")
        for command in run.split("&&")
        if "pip install" in command
    ]
    assert commands == [
        f'pip install "torch=={pin}" --index-url {cpu_index}',
        readme_install,
    ]


def test_it_starts_server_py_on_all_addresses_with_both_ports_exposed() -> None:
    (entrypoint,) = the("ENTRYPOINT")
    (cmd,) = the("CMD")
    assert json.loads(entrypoint) == ["python", "server.py"]
    args = build_parser({}).parse_args(json.loads(cmd))
    assert args.host == "0.0.0.0"
    (expose,) = the("EXPOSE")
    assert {int(port) for port in shlex.split(expose)} == {int(args.port), int(args.grpc_port)}
    assert int(args.port) == 8000 and int(args.grpc_port) == DEFAULT_GRPC_PORT


def test_it_runs_as_the_non_root_user_the_deployment_expects() -> None:
    (user,) = the("USER")
    assert user != "0" and user != "root"
    (deployment,) = of_kind("Deployment")
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsUser"] == int(user)
    assert any("useradd" in run and f"--uid {user}" in run for run in the("RUN"))
    # The Deployment's args replace CMD and keep the ENTRYPOINT: they start the same server.
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "command" not in container
