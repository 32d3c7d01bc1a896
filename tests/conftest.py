"""Fixtures shared by the published-runs test modules."""

from __future__ import annotations

import pytest

from parsearch.validation.published.published_runs import PublishedRun, load_published_runs


@pytest.fixture(scope="session")
def runs() -> list[PublishedRun]:
    """The bundled published runs, loaded once."""
    return load_published_runs()


@pytest.fixture(scope="session")
def by_id(runs: list[PublishedRun]) -> dict[str, PublishedRun]:
    return {run.id: run for run in runs}
