"""The layouts a user can actually run, read from a file, to bound a profiling plan.

``plan-profiling`` proposes layouts from the top of the predicted ranking; on a real
cluster some of those cannot be launched (a kernel missing for a shape, a scheduler that
only hands out certain node counts, a recipe pinned to some degrees).  A runnable-layouts
file lists the ones that can, one per line, in either form parsearch prints:

* the ``--layout`` form, ``tp=8,pp=4,vpp=2,ep=1,mbs=1,sp=true,recompute=selective``
  (omitted keys take their defaults);
* the layout key of ``search`` JSON/CSV output, ``tp8-cp1-pp4-vpp2-ep1-etp1-mbs1-sp1-rsel``.

Blank lines and ``#`` comments are skipped.  The plan then chooses only among these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.layout.rules import RECOMPUTE_CODES
from parsearch.layout.space import LayoutTable
from parsearch.layout.spec import parse_layout_key, parse_layout_string

#: The columns that make two layouts the same run.
MATCH_COLUMNS: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "sp",
                                  "recompute")


@dataclass(frozen=True)
class RunnableLayouts:
    """The layouts of a runnable-layouts file and where it came from."""

    source: str
    layouts: tuple[Layout, ...]


def read_runnable_layouts(path: str | Path, num_gpus: int) -> RunnableLayouts:
    """The layouts listed in ``path`` (module docstring), on ``num_gpus`` GPUs.

    A line that is not a layout is an error naming the file, the line and why.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"--candidates {name}: cannot read the runnable-layouts file "
                        f"({getattr(error, 'strerror', None) or error})") from None
    layouts: list[Layout] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            layout = (parse_layout_string(line, num_gpus) if "=" in line
                      else parse_layout_key(line, num_gpus))
        except (SpecError, TypeError, ValueError) as error:
            raise SpecError(f"--candidates {name} line {number}: {line!r} is not a layout "
                            f"({error}); write it as tp=8,pp=4,... or as a layout key "
                            "tp8-cp1-pp4-vpp1-ep1-etp1-mbs1-sp1-rnone") from None
        if layout not in layouts:
            layouts.append(layout)
    if not layouts:
        raise SpecError(f"--candidates {name}: no layout in the file (one per line, "
                        "e.g. tp=8,pp=4,sp=true)")
    return RunnableLayouts(name, tuple(layouts))


def runnable_rows(table: LayoutTable, layouts: tuple[Layout, ...]
                  ) -> tuple[np.ndarray, tuple[Layout, ...]]:
    """Indices of ``table``'s rows that are one of ``layouts``, and the layouts that are
    no valid layout of the table's job (they break a layout rule for this model, batch
    or GPU count)."""
    cols = table.columns
    wanted_values = {_values(layout) for layout in layouts}
    stacked = np.stack([np.asarray(cols[c], dtype=np.int64) for c in MATCH_COLUMNS], axis=1)
    wanted = np.zeros(len(table), dtype=bool)
    found: set[tuple[int, ...]] = set()
    for values in wanted_values:
        hit = np.all(stacked == np.asarray(values, dtype=np.int64), axis=1)
        if hit.any():
            found.add(values)
            wanted |= hit
    missing = tuple(layout for layout in layouts if _values(layout) not in found)
    return np.flatnonzero(wanted), missing


def _values(layout: Layout) -> tuple[int, ...]:
    return (layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.vpp, layout.mbs,
            int(layout.sp), RECOMPUTE_CODES[layout.recompute])
