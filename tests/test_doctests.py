"""Run the worked examples in the package's docstrings (on the installed package)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import parsearch

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(parsearch.__path__, prefix="parsearch.")
    if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
