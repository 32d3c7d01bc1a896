"""Inputs left out of a command (rows of a measurements table, runs of a log): what is
wrong comes first, on one line; the per-input detail follows, indented, at most
:data:`SHOWN` lines of it (a table with thousands of bad rows does not fill the screen).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from parsearch.errors import SpecError

#: Left-out inputs listed one per line; the rest are counted.
SHOWN = 20


def detail(lines: Sequence[str]) -> str:
    """The indented per-input lines (at most :data:`SHOWN`, then how many more)."""
    shown = [f"  {line}" for line in lines[:SHOWN]]
    if len(lines) > SHOWN:
        shown.append(f"  ... and {len(lines) - SHOWN:,} more left out for reasons like these")
    return "\n".join(shown)


def print_left_out(command: str, lines: Sequence[str], used: int) -> None:
    """``lines`` (one per input left out) on stderr: one line alone, or a count then detail."""
    if not lines:
        return
    if len(lines) == 1:
        print(f"parsearch {command}: left out: {lines[0]}", file=sys.stderr)
        return
    print(f"parsearch {command}: {len(lines):,} input(s) left out, {used:,} used; the reasons:\n"
          f"{detail(lines)}", file=sys.stderr)


def _short(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."


def nothing_usable(sources: Sequence[str], lines: Sequence[str],
                   notes: Sequence[str] = ()) -> SpecError:
    """The error of a command none of whose inputs could be used: the count first, then why
    (and the notes about the inputs, after the reasons)."""
    named = ", ".join(_short(s) for s in sources[:3]) + (
        f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    after = "".join(f"\n  note: {note}" for note in notes[:SHOWN])
    if not lines:
        return SpecError(f"no usable measurement in {named}{after}")
    return SpecError(f"no usable measurement in {named}: all {len(lines):,} input(s) left "
                     f"out; the reasons:\n{detail(lines)}{after}")


__all__ = ["SHOWN", "detail", "nothing_usable", "print_left_out"]
