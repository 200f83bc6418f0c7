"""The docs as a newcomer meets them: a short README, a site that builds strictly with every page
reachable, figures that name their command and raw results, and setup lines that agree."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()


def nav_pages(entries: object) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    raise AssertionError(f"nav entry {entries!r}")


def test_the_readme_is_short_and_starts_with_the_quick_start() -> None:
    lines = README.splitlines()
    assert len(lines) <= 300
    quick = lines.index("## Quick start")
    assert quick < 20
    start = README.index("python scripts/install.py && python server.py")
    assert start < README.index('curl -X POST -d "some text"') < README.index("pip install openai")
    assert "in the foreground" in README and "second terminal" in README and "ready:" in README
    assert "python scripts/install.py test && python -m pytest" in README
    assert 'python -m pytest -m "not slow"' in README


def test_every_page_of_docs_is_in_the_site_s_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert set(listed) == pages


def test_the_site_builds_with_every_link_anchor_and_example_in_place(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The examples are included into the pages, not linked.
    page = (tmp_path / "embeddings" / "index.html").read_text()
    assert "Embeddings through the official openai SDK" in page


def test_every_figure_of_the_results_page_names_a_command_of_this_repository_and_its_json() -> None:
    results = (DOCS / "benchmarks.md").read_text()
    rows = [
        line for line in results.splitlines() if re.match(r"\| .* \| 20\d\d-\d\d-\d\d \|", line)
    ]
    assert len(rows) >= 10
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        measurement, figure, date, commit, engine, command, raw = cells[:7]
        assert re.fullmatch(r"[0-9a-f]{7}", commit), row
        if command != "as above":
            words = shlex.split(command.strip("`"))
            assert words[0] == "python", row
            target = ROOT / words[1] if words[1] != "-m" else ROOT / words[2].split(".")[0]
            assert target.exists(), f"no {target} for: {row}"
        named = re.findall(r"`([\w.-]+\.json)`", raw)
        assert named, row
        for name in named:
            assert (DOCS / "results" / name).is_file(), name
    for name in re.findall(r"docs/results/([\w.-]+\.json)", README):
        assert (DOCS / "results" / name).is_file(), name


def test_no_page_names_an_issue_the_team_or_a_commit_in_its_prose() -> None:
    words = re.compile(r"\bthe issue\b|\bissue's\b|\bthe team\b|product brief|this commit", re.I)
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = page.read_text()
        assert not words.search(text), (page, words.search(text))
        for line in text.splitlines():
            if not line.startswith("|"):  # a table's commit column is data
                assert not re.search(r"commit `?[0-9a-f]{7}", line), (page, line)


def test_the_load_tool_installs_as_the_readme_installs() -> None:
    tool = (ROOT / "load_test" / "README.md").read_text()
    assert "python scripts/install.py loadtest" in tool
    assert "pip install -e" not in tool


def test_the_image_built_is_the_image_kubernetes_pulls() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    image = f"batching:{version}"
    deployment = (ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text()
    assert set(re.findall(r"image: (\S+)", deployment)) == {image}
    for text in ((DOCS / "scale-out.md").read_text(), (ROOT / "Dockerfile").read_text()):
        for built in re.findall(r"docker build -t (\S+)", text):
            assert built == image


def test_the_api_key_file_the_docs_write_is_ignored_by_git() -> None:
    assert "> api-keys " in (DOCS / "access.md").read_text()
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "api-keys"], cwd=ROOT, check=False, capture_output=True
    )
    assert ignored.returncode == 0
