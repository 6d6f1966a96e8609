"""The catalogue of real failures (tests/catalogue/threads.py): every public thread
simulated as closely as this machine allows, and the doctor's verdict, cause and fix
checked against what the thread converged on; docs/troubleshooting.md agrees with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.catalogue.docs import CHECK_TITLES, render
from tests.catalogue.harness import simulate
from tests.catalogue.threads import THREADS, Scenario, Thread
from tests.support.children import REPO
from tests.support.fakecuda import needs_gcc

PAGE = REPO / "docs" / "troubleshooting.md"


def unwrapped(text: str) -> str:
    return " ".join(text.split())


@needs_gcc
@pytest.mark.slow
@pytest.mark.parametrize("thread", THREADS, ids=[t.id for t in THREADS])
def test_the_doctor_catches_the_thread(thread: Thread, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, report = simulate(thread, tmp_path, monkeypatch)
    named = next(c for c in report.checks if c.id == thread.check)
    assert outcome.detected, report.verdict()
    assert named.status == thread.status, (named.found, named.fix)
    assert named.title == CHECK_TITLES[thread.check]
    assert outcome.cause_named, [(c.title, c.found) for c in report.checks
                                 if c.status in ("warn", "error")]
    assert unwrapped(outcome.fix) in unwrapped(named.fix), named.fix
    assert outcome.fix_printed, outcome.table


@needs_gcc
@pytest.mark.slow
def test_the_simulated_machine_is_healthy_without_a_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline every thread changes one thing of: ready, without a warning."""
    control = Thread("control/healthy#0", "nothing", "nothing", "driver.cuda_init", "ok", (),
                     "", Scenario())
    _, report = simulate(control, tmp_path, monkeypatch)
    assert report.verdict() == "ready: 2 GPUs, TF 2.21.0, CUDA 12.5", [
        (c.title, c.found) for c in report.checks if c.status in ("warn", "error")]


def test_the_catalogue_is_well_formed() -> None:
    ids = [t.id for t in THREADS]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    for thread in THREADS:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", thread.id), thread.id
        assert thread.status in ("warn", "error") and thread.cause and thread.fix
        assert thread.check in CHECK_TITLES, thread.check


def test_the_troubleshooting_page_is_the_catalogue() -> None:
    """docs/troubleshooting.md is written from the catalogue: regenerate it with
    `python -m tests.catalogue.docs > docs/troubleshooting.md`."""
    text = PAGE.read_text()
    assert text == render()
    for thread in THREADS:
        assert thread.url in text
        assert unwrapped(thread.fix.replace("{tmp}", "").replace(
            "{site}", "<site-packages>")) in unwrapped(text)
    # Links: absolute (the threads) or to a heading of this page, nothing else.
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert target.startswith(("https://", "#")), target
