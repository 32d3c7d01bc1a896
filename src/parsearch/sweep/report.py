"""The report of a sweep: one row per cell (table, JSON, CSV) and throughput plots of the grid.

The plot has one panel per model: predicted tokens/s against GPU count, one
line per (cluster, global batch, sequence length); cells where no layout
fits are left out of the lines and counted in the panel title.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsearch.errors import SpecError
from parsearch.files import is_dir, write_atomically
from parsearch.sweep.grid import Cell
from parsearch.sweep.queue import CellQueue, Progress

PLOT_SUFFIXES: tuple[str, ...] = (".png", ".svg", ".pdf")
COLUMNS: tuple[str, ...] = ("model", "cluster", "gpus", "global_batch", "seq_len", "status",
                            "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "memory_gib",
                            "layout", "bottleneck", "reason")


@dataclass(frozen=True)
class SweepReport:
    """Every cell of the grid with its answer (``status`` ``pending`` while unanswered)."""

    name: str
    storage: str
    rows: tuple[dict[str, Any], ...]
    progress: Progress
    retried: int

    def to_dict(self) -> dict[str, Any]:
        p = self.progress
        return {"sweep": self.name, "storage": self.storage, "cells": p.cells, "done": p.done,
                "running": p.running, "waiting": p.waiting, "failed": len(p.failed),
                "retried": self.retried, "rows": [dict(r) for r in self.rows]}


def build_report(queue: CellQueue) -> SweepReport:
    from parsearch.search.storage import redact

    results = queue.results()
    progress = queue.progress()
    failed = set(progress.failed)
    rows = []
    for index, cell in enumerate(queue.cells):
        status = "failed" if index in failed else "pending"
        answer = results.get(index, {"status": status})
        rows.append(_row(cell, answer))
    return SweepReport(queue.name, redact(queue.url), tuple(rows), progress, queue.retried())


def _row(cell: Cell, answer: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"model": cell.model, "cluster": cell.cluster, "gpus": cell.gpus,
                           "global_batch": cell.global_batch, "seq_len": cell.seq_len}
    for key in COLUMNS[5:]:
        value = answer.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # strict JSON: never NaN or Infinity
        row[key] = value
    return row


def table_rows(report: SweepReport) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Headers and rows of the text table."""
    headers = ("model", "cluster", "gpus", "batch", "seq", "status", "tokens/s",
               "tokens/s/gpu", "mfu%", "mem_GiB", "layout", "bottleneck")
    rows = []
    for r in report.rows:
        ok = r["status"] == "ok"
        rows.append((r["model"], r["cluster"], r["gpus"], r["global_batch"], r["seq_len"],
                     r["status"],
                     r["tokens_per_s"] if ok else "-",
                     r["tokens_per_s_per_gpu"] if ok else "-",
                     100 * r["mfu"] if ok and r["mfu"] is not None else "-",
                     r["memory_gib"] if ok else "-",
                     r["layout"] if ok else (r["reason"] or "-")[:60],
                     r["bottleneck"] if ok else "-"))
    return headers, rows


def csv_text(report: SweepReport) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in report.rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})
    return out.getvalue()


# --- plots --------------------------------------------------------------------------------------


def check_plot_path(path: str) -> Path:
    """Refuse a plot path that cannot be written, before any work starts."""
    target = Path(path)
    if target.suffix.lower() not in PLOT_SUFFIXES:
        raise SpecError(f"--plot {path!r}: the file name must end in "
                        f"{', '.join(PLOT_SUFFIXES)}")
    if is_dir(target):
        raise SpecError(f"--plot {path!r} is a folder; give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not is_dir(parent):
        raise SpecError(f"--plot {path!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise SpecError(f"--plot {path!r}: folder {str(parent)!r} is not writable")
    return target


def _series(report: SweepReport, model: str) -> dict[tuple[str, int, int], list[tuple[int, float]]]:
    lines: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    for r in report.rows:
        if r["model"] != model:
            continue
        key = (r["cluster"], r["global_batch"], r["seq_len"])
        lines.setdefault(key, [])
        if r["status"] == "ok" and r["tokens_per_s"]:
            lines[key].append((r["gpus"], float(r["tokens_per_s"])))
    return lines


def write_plot(report: SweepReport, path: str) -> Path:
    """Draw tokens/s against GPUs for every model of the sweep into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = check_plot_path(path)
    models = list(dict.fromkeys(r["model"] for r in report.rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(8, 3.6 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        missing = sum(1 for r in report.rows if r["model"] == model and r["status"] != "ok")
        for (cluster, batch, seq), points in _series(report, model).items():
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, marker="o", label=f"{cluster}, batch {batch}, seq {seq}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("predicted tokens/s")
        ax.set_title(model + (f" ({missing} cells without a fitting layout or answer)"
                              if missing else ""))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"sweep {report.name}: {report.progress.done} of {report.progress.cells} cells")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=target.suffix.lower().lstrip("."), dpi=110)
    plt.close(fig)
    write_atomically(target, buffer.getvalue())
    return target


def summary_line(report: SweepReport, seconds: float | None = None,
                 answered: Sequence[int] | None = None) -> str:
    p = report.progress
    text = (f"sweep {report.name}: {p.done} of {p.cells} cells done, {p.running} running, "
            f"{p.waiting} waiting, {len(p.failed)} failed, {report.retried} retried")
    if answered is not None:
        text += f"; this process answered {len(answered)}"
    if seconds is not None:
        text += f" ({seconds:.1f} s)"
    return text


__all__ = ["COLUMNS", "PLOT_SUFFIXES", "SweepReport", "build_report", "check_plot_path",
           "csv_text", "summary_line", "table_rows", "write_plot"]
