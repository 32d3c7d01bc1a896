"""Run the CLI in-process and capture its streams and exit code."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from parsearch.cli import main
from parsearch.errors import SpecError


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*argv: str) -> CliResult:
    """``parsearch argv...`` with stdout/stderr captured; SystemExit becomes the code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as stop:
            code = int(stop.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def assert_one_line_error(result: CliResult, *fragments: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr containing every fragment."""
    assert result.code == 2, result
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def error_reading(path: Path, text: str, read: Callable[[Path], object]) -> str:
    """The message of the :class:`SpecError` ``read`` raises on a file holding ``text``."""
    path.write_text(text, encoding="utf-8")
    try:
        read(path)
    except SpecError as error:
        return str(error)
    raise AssertionError(f"reading {path} raised no SpecError")
