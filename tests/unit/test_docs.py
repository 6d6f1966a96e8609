"""The documentation: the README is a front door that links into docs/, which MkDocs
builds --strict (no broken link or anchor) and offline; every setting the code declares
is in the settings reference and .env.example; each fact has one page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from mgpu_env.config.exitcodes import DOCUMENTED
from mgpu_env.config.settings import DECLARATIONS
from tests.support.children import REPO

DOCS = REPO / "docs"
README_MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("document", ["docs/settings.md", ".env.example"])
def test_every_setting_is_documented(document: str) -> None:
    text = (REPO / document).read_text()
    missing = [d.env for d in DECLARATIONS if f"`{d.env}`" not in text and
               f"#{d.env}=" not in text]
    assert not missing, f"{document} does not mention {missing}"


def test_env_example_shows_each_default() -> None:
    lines = (REPO / ".env.example").read_text().splitlines()
    for declaration in DECLARATIONS:
        assert f"#{declaration.env}={declaration.default}" in lines, declaration.env


def test_the_docs_build_strict_and_offline(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The offline plugin writes page.html files, which open from file:// too.
    assert (tmp_path / "index.html").is_file() and (tmp_path / "settings.html").is_file()
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    # Nothing that fetches at build or view time: no social cards, no privacy plugin,
    # no Google Fonts.
    assert set(config["plugins"]) <= {"search", "offline"}
    assert config["theme"]["font"] is False


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = {next(iter(entry.values())) for entry in config["nav"]}
    assert listed == {page.name for page in pages()}


def anchors_of(path: Path) -> set[str]:
    return {slugify(re.sub(r"[`*]", "", title), "-") for title in
            HEADING.findall(path.read_text())}


def test_the_readme_is_a_front_door_whose_links_into_docs_all_land() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = [link for link in LINK.findall(text) if link.startswith("docs/")]
    assert {page.relative_to(REPO).as_posix() for page in pages()} <= {
        link.split("#")[0] for link in linked}, "the README links to every page"
    for link in linked:
        file, _, anchor = link.partition("#")
        assert (REPO / file).is_file(), link
        if anchor:
            assert anchor in anchors_of(REPO / file), link


@pytest.mark.parametrize("fact", [
    "keras-team/keras#20585",  # why Keras 2 between workers: explained on one page
    "flag, then environment, then the settings file",  # the precedence rule
    "else v1 (`docker-compose`)",  # Compose v1 and v2
    "151 to 182 MiB",  # what a 5 GiB .npy adds to the peak memory
    "| `BENCH_TIMEOUT` |",  # bench's settings: one table
])
def test_each_fact_is_said_once(fact: str) -> None:
    texts = {path.relative_to(REPO).as_posix(): " ".join(path.read_text().split())
             for path in [REPO / "README.md", *pages()]}
    where = [name for name, text in texts.items() if fact in text]
    assert len(where) == 1 and texts[where[0]].count(fact) == 1, f"{fact!r} is in {where}"


def test_the_exit_code_table_is_the_declared_codes() -> None:
    text = (DOCS / "outputs.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("\n\n", 2)[1]
    documented = {int(row.split("|")[1]) for row in table.splitlines()
                  if re.match(r"\| \d+ \|", row)}
    assert documented == set(DOCUMENTED), (
        f"docs/outputs.md's table lists {sorted(documented)}; mgpu_env/config/exitcodes.py "
        f"declares {sorted(DOCUMENTED)}")
