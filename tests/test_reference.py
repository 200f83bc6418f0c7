"""The reference pages of docs/reference/ are what ``scripts/gen_reference.py`` writes from the
code now: the parser's flags, the app's routes, the gRPC descriptors, the metrics registry."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "scripts" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = generator()


@pytest.mark.parametrize("name", sorted(GEN.PAGES))
def test_each_reference_page_is_what_the_code_generates_now(name: str) -> None:
    written = (ROOT / "docs" / "reference" / name).read_text()
    assert written == GEN.PAGES[name](), (
        f"docs/reference/{name} is stale: run python scripts/gen_reference.py"
    )


def test_a_page_that_differs_from_the_code_is_named_by_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(GEN, "REFERENCE", tmp_path)
    assert GEN.main([]) == 0
    assert GEN.main(["--check"]) == 0
    page = tmp_path / "cli.md"
    page.write_text(page.read_text().replace("`--max-batch-size`", "`--max-batch`"))
    capsys.readouterr()
    assert GEN.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "docs/reference/cli.md is stale: run python scripts/gen_reference.py"
    ]


def test_every_route_of_the_app_is_described_and_every_description_has_its_route() -> None:
    paths = [path for path, _ in GEN.routes(GEN.light_app())]
    assert len(paths) == len(set(paths))
    assert set(paths) == set(GEN.ROUTES)


def test_the_routes_that_take_any_method_show_the_one_they_serve() -> None:
    methods = dict(GEN.routes(GEN.light_app()))
    assert methods["/v1/embeddings"] == ["POST"]
    assert methods["/v1/models"] == ["GET"]
    assert methods["/v2/logging"] == ["GET", "POST"]


def test_every_flag_and_its_twin_is_on_the_command_line_page() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    parser = GEN.server_parser()
    for action in parser._actions:
        for option in action.option_strings:
            if option not in ("-h", "--help"):
                assert f"`{option}`" in page
        twin = re.search(r"\[env (BATCHING_[A-Z_]+)", action.help or "")
        if twin:
            assert f"`{twin.group(1)}`" in page


def test_every_metric_of_the_registry_is_on_the_metrics_page_with_its_labels() -> None:
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    found = GEN.metrics()
    assert any(name == "batching_requests_total" for name, *_ in found)
    for name, _, labels, _ in found:
        (row,) = [line for line in page.splitlines() if line.startswith(f"| `{name}` |")]
        for label in labels:
            assert f"`{label}`" in row


def test_every_rpc_of_the_descriptor_is_on_the_grpc_page() -> None:
    from tritonclient.grpc import service_pb2

    page = (ROOT / "docs" / "reference" / "grpc.md").read_text()
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        assert f"| `{method.name}` |" in page
    assert "| `ModelStreamInfer` | `ModelInferRequest` | `ModelStreamInferResponse` |" in page
