"""The README and .env.example document every setting the code declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_env.config.settings import DECLARATIONS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("document", ["README.md", ".env.example"])
def test_every_setting_is_documented(document: str) -> None:
    text = (REPO / document).read_text()
    missing = [d.env for d in DECLARATIONS if d.env not in text]
    assert not missing, f"{document} does not mention {missing}"


def test_env_example_shows_each_default() -> None:
    lines = (REPO / ".env.example").read_text().splitlines()
    for declaration in DECLARATIONS:
        assert f"#{declaration.env}={declaration.default}" in lines, declaration.env
