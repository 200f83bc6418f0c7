"""The Dockerfile: no container engine runs here, so what can be checked without building it
is checked: its install commands are the README's, and its start command is the server's."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from batching.settings.cli import build_parser
from batching.settings.serving import DEFAULT_GRPC_PORT
from tests.support.manifests import of_kind

ROOT = Path(__file__).resolve().parents[2]
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


def test_its_install_command_is_the_readmes() -> None:
    quick_start = re.search(r"```bash\n(# 1\..*?)```", README, re.S)
    assert quick_start is not None
    serve = next(line for line in quick_start.group(1).splitlines() if "python server.py" in line)
    readme_install = serve.split("&&")[0].strip()
    assert readme_install == "python scripts/install.py"
    commands = [
        " ".join(command.split())
        for run in the("RUN")
        for command in run.split("&&")
        if "install" in command and "useradd" not in command
    ]
    assert commands == [readme_install]


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
    # Numeric: kubelet can enforce runAsNonRoot only on a user id it can read from the image.
    assert user.isdigit()
    (deployment,) = of_kind("Deployment")
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsUser"] == int(user)
    assert any("useradd" in run and f"--uid {user}" in run for run in the("RUN"))
    # The Deployment's args replace CMD and keep the ENTRYPOINT: they start the same server.
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "command" not in container
