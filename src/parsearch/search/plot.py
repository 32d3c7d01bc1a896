"""Draw a throughput-against-GPU-count front: a PNG (matplotlib) or a self-contained HTML page.

The HTML page is one file with an inline SVG chart (hover a point for its
layout and numbers) and a table of the front with the launch settings; it
loads nothing from the network.  A result over several clusters is drawn
as one series (colour) per cluster, each with its own front, and the
overall front as a dashed black line.  Files are written atomically (a temporary
file in the same folder, then a rename), so an interrupted run never leaves
a half-written plot behind.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsearch.errors import SpecError
from parsearch.files import write_atomically

if TYPE_CHECKING:  # pragma: no cover
    from parsearch.search.results import ParetoPoint, ParetoResult

PLOT_SUFFIXES: tuple[str, ...] = (".png", ".html", ".htm")
#: One colour per cluster series (cycled when there are more clusters).
SERIES_COLORS: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                  "#e377c2", "#17becf", "#bcbd22")
_OVERALL_COLOR = "#222222"


def write_plot(result: ParetoResult, path: str | os.PathLike[str], *,
               title: str | None = None) -> Path:
    """Write the front of ``result`` to ``path`` (``.png`` or ``.html``); returns the path."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise SpecError(f"--plot {str(path)!r}: the file name must end in .png or .html")
    if target.parent and not target.parent.exists():
        raise SpecError(f"--plot {str(path)!r}: folder {str(target.parent)!r} does not exist")
    title = title or _title(result)
    if suffix == ".png":
        data = _png_bytes(result, title)
    else:
        data = html_page(result, title).encode("utf-8")
    try:
        write_atomically(target, data)
    except (OSError, ValueError) as error:  # read-only folder, a folder of that name, NUL...
        reason = getattr(error, "strerror", None) or str(error)
        raise SpecError(f"--plot {str(path)!r}: cannot write the file: {reason}") from None
    return target


def _title(result: ParetoResult) -> str:
    q = result.query
    where = ", ".join(result.clusters) if result.multi_cluster else q["cluster"]
    return (f"{q['model']} on {where}: throughput vs GPUs "
            f"(batch {q['global_batch']} x {q['seq_len']} tokens, {result.method})")


def _series_color(index: int) -> str:
    return SERIES_COLORS[index % len(SERIES_COLORS)]


def _cluster_colors(result: ParetoResult) -> dict[str, str]:
    return {name: _series_color(i) for i, name in enumerate(result.clusters)}


def _png_bytes(result: ParetoResult, title: str) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    points = result.points
    if result.multi_cluster:
        _png_cluster_series(ax, result)
    else:
        _png_single_series(ax, result)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    if not points:
        ax.text(0.5, 0.5, "no layout fits on any GPU count", transform=ax.transAxes,
                ha="center")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _png_cluster_series(ax: Any, result: ParetoResult) -> None:
    """One colour per cluster (its best points and its front), the overall front dashed."""
    for i, part in enumerate(result.per_cluster):
        color = _series_color(i)
        if part.points:
            ax.scatter([p.num_gpus for p in part.points], [p.tokens_per_s for p in part.points],
                       s=12, color=color, alpha=0.45, zorder=2)
        if part.front:
            ax.plot([p.num_gpus for p in part.front], [p.tokens_per_s for p in part.front],
                    "-o", ms=3, lw=1.2, color=color, label=f"{part.clusters[0]} front",
                    zorder=3)
    if result.front:
        ax.plot([p.num_gpus for p in result.front], [p.tokens_per_s for p in result.front],
                "--o", ms=6, lw=1.5, color=_OVERALL_COLOR, mfc="none",
                label="overall front (all clusters)", zorder=4)


def _png_single_series(ax: Any, result: ParetoResult) -> None:
    points = result.points
    front = result.front
    if points:
        ax.scatter([p.num_gpus for p in points], [p.tokens_per_s for p in points], s=14,
                   color="#b0b0b0", label="best at each GPU count", zorder=2)
    if front:
        ax.plot([p.num_gpus for p in front], [p.tokens_per_s for p in front], "-o", ms=4,
                color="#1f77b4", label="Pareto front", zorder=3)
        eff = ax.twinx()
        eff.plot([p.num_gpus for p in front], [100 * p.scaling_efficiency for p in front],
                 "--", color="#d62728", lw=1, label="scaling efficiency")
        eff.set_ylabel("scaling efficiency vs smallest point (%)", color="#d62728")
        eff.set_ylim(0, max(105.0, 100 * max(p.scaling_efficiency for p in front) + 5))


def _ticks(low: float, high: float, count: int = 6) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = (low // step) * step
    ticks = []
    value = first
    while value <= high + 1e-9:
        if value >= low - 1e-9:
            ticks.append(value)
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


@dataclass(frozen=True)
class _Line:
    """A polyline through some points (a front) in one colour."""

    points: Sequence[ParetoPoint]
    color: str
    dashed: bool = False


#: How a point is drawn: fill colour, radius, outline colour (or ``None``).
_DotStyle = Callable[["ParetoPoint"], tuple[str, int, str | None]]


def _single_dot(p: ParetoPoint) -> tuple[str, int, str | None]:
    return ("#1f77b4", 4, None) if p.on_front else ("#b0b0b0", 3, None)


def _svg(points: Sequence[ParetoPoint], lines: Sequence[_Line], dot: _DotStyle,
         legend: Sequence[tuple[str, str]] = (), width: int = 760, height: int = 420) -> str:
    left, right, top, bottom = 70, 20, 20, 50
    if not points:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="80">'
                '<text x="10" y="40">no layout fits on any GPU count</text></svg>')
    xs = [p.num_gpus for p in points]
    ys = [p.tokens_per_s for p in points]
    x_lo, x_hi = 0.0, max(xs) * 1.05
    y_lo, y_hi = 0.0, max(ys) * 1.1

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (y - y_lo) / (y_hi - y_lo) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11">']
    for t in _ticks(x_lo, x_hi):
        parts.append(f'<line x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" '
                     f'y2="{height - bottom}" stroke="#eee"/>'
                     f'<text x="{sx(t):.1f}" y="{height - bottom + 15}" '
                     f'text-anchor="middle">{_fmt(t)}</text>')
    for t in _ticks(y_lo, y_hi):
        parts.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{width - right}" '
                     f'y2="{sy(t):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">'
                     f'{_fmt(t)}</text>')
    parts.append(f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
                 f'y2="{height - bottom}" stroke="#333"/>'
                 f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" '
                 'stroke="#333"/>'
                 f'<text x="{(left + width - right) / 2}" y="{height - 12}" '
                 'text-anchor="middle">GPUs</text>'
                 f'<text x="16" y="{(top + height - bottom) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {(top + height - bottom) / 2})">tokens/s</text>')
    for line in lines:
        if line.points:
            coords = " ".join(f"{sx(p.num_gpus):.1f},{sy(p.tokens_per_s):.1f}"
                              for p in line.points)
            dash = ' stroke-dasharray="6 4"' if line.dashed else ""
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{line.color}" '
                         f'stroke-width="2"{dash}/>')
    for p in points:
        color, radius, outline = dot(p)
        ring = f' stroke="{outline}" stroke-width="1.5"' if outline else ""
        parts.append(f'<circle cx="{sx(p.num_gpus):.1f}" cy="{sy(p.tokens_per_s):.1f}" '
                     f'r="{radius}" fill="{color}"{ring}><title>{_tip(p)}</title></circle>')
    for i, (label, color) in enumerate(legend):
        y = top + 6 + 16 * i
        parts.append(f'<rect x="{left + 10}" y="{y - 8}" width="10" height="10" '
                     f'fill="{color}"/><text x="{left + 26}" y="{y + 1}">'
                     f'{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _tip(p: ParetoPoint) -> str:
    where = f"{p.cluster}, " if p.cluster is not None else ""
    return html.escape(
        f"{where}{p.num_gpus} GPUs: {p.tokens_per_s:,.0f} tokens/s, "
        f"{p.estimate.tokens_per_s_per_gpu:,.0f}/GPU, MFU {100 * p.estimate.mfu:.1f}%, "
        f"efficiency {100 * p.scaling_efficiency:.1f}%\n{p.layout.key()}\n"
        f"bottleneck: {p.estimate.bottleneck}")


def _chart(result: ParetoResult) -> str:
    """The SVG chart: one series, or one per cluster and the overall front."""
    if not result.multi_cluster:
        return _svg(result.points, [_Line(result.front, "#1f77b4")], _single_dot)
    colors = _cluster_colors(result)
    lines = [_Line(part.front, colors[name]) for name, part in result.by_cluster.items()]
    lines.append(_Line(result.front, _OVERALL_COLOR, dashed=True))

    def dot(p: ParetoPoint) -> tuple[str, int, str | None]:
        color = colors.get(p.cluster or "", "#b0b0b0")
        return (color, 5, _OVERALL_COLOR) if p.on_front else (color, 3, None)

    legend = [*colors.items(), ("overall front (all clusters)", _OVERALL_COLOR)]
    return _svg(result.points, lines, dot, legend)


def html_page(result: ParetoResult, title: str | None = None) -> str:
    """The self-contained HTML page for ``result`` (inline SVG, no scripts from the network)."""
    title = title or _title(result)
    multi = result.multi_cluster
    rows = []
    for p in result.front:
        e = p.estimate
        launch = html.escape(" ".join(p.launch.bridge_overrides))
        cluster = f"<td>{html.escape(p.cluster or '')}</td>" if multi else ""
        rows.append(
            f"<tr>{cluster}<td>{p.num_gpus}</td><td>{p.launch.nodes}</td>"
            f"<td>{e.tokens_per_s:,.0f}</td><td>{e.tokens_per_s_per_gpu:,.0f}</td>"
            f"<td>{100 * e.mfu:.1f}%</td><td>{100 * p.scaling_efficiency:.1f}%</td>"
            f"<td><code>{html.escape(p.layout.key())}</code></td>"
            f"<td>{html.escape(e.bottleneck)}</td><td><code>{launch}</code></td></tr>")
    summary = (f"method {html.escape(result.method)}; {result.considered:,} considered, "
               f"{result.valid:,} valid, {result.feasible:,} feasible, "
               f"{result.evaluations:,} evaluated; {result.elapsed_s:.1f} s")
    if multi:
        caption = ("One colour per cluster: its best layout at each GPU count and its own "
                   "front; dashed black: the overall front over all clusters (more throughput "
                   "than any smaller GPU count on any cluster), ringed points lie on it. "
                   "Hover a point for its layout.")
    else:
        caption = ("Blue: the Pareto front (more throughput than any smaller GPU count); "
                   "grey: the best layout at other GPU counts. Hover a point for its layout.")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:20px}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        f"td:nth-child(n+{8 if multi else 7}){{text-align:left}}"
        + ("td:first-child{text-align:left}" if multi else "")
        + "code{font-size:11px}</style></head><body>"
        f"<h3>{html.escape(title)}</h3><p>{summary}</p>"
        f"{_chart(result)}"
        f"<p>{caption}</p>"
        "<table><tr>" + ("<th>cluster</th>" if multi else "")
        + "<th>GPUs</th><th>nodes</th><th>tokens/s</th><th>tokens/s/GPU</th>"
        "<th>MFU</th><th>scaling eff.</th><th>layout</th><th>bottleneck</th>"
        "<th>Megatron-Bridge overrides</th></tr>"
        + "".join(rows) + "</table></body></html>\n")


__all__ = ["PLOT_SUFFIXES", "SERIES_COLORS", "html_page", "write_plot"]
