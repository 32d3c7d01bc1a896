"""Every number the README and the docs/ pages quote carries its date (issue 36).

A quoted number is a percentage (MAPE, shares, errors) or a number followed by a unit
of memory, bandwidth, throughput or time (GiB, GB/s, tokens/s, TFLOP/s, ms, s), or a
decimal ratio (``1.8x``).  Each must have a ``YYYY-MM-DD`` date in its context:

* a paragraph: the paragraph (lines up to a blank line);
* a list item (``-``, ``*``, ``1.``): the item, or the paragraph that leads into the
  list when it ends with a colon;
* a table row: the row, the header row, or the paragraph just above the table (its
  caption);

or in any heading above it (the section it sits under).  Fenced code blocks and inline
code (commands, flags, file names) are not read; the few numbers that are settings or
inputs rather than measurements or predictions are listed in :data:`EXEMPT` with the
reason, each by the exact text it is quoted in, so a new number next to one is still
checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
#: A quoted measured or predicted number.
NUMBER = re.compile(
    r"(?<![\w.-])\d[\d,]*(?:\.\d+)?\s?"
    r"(?:%"
    r"|(?:GiB|MiB|TiB|GB|TB)(?![\w/])"
    r"|(?:GB|TB|Gb|MB)/s"
    r"|(?:tokens|tok)/s|tokens per second"
    r"|[TP]FLOP/s"
    r"|(?:ms|µs|us|s)\b)"
    r"|(?<![\w.-])\d+\.\d+\s?[x×](?!\w)"
)

#: ``{page: {exact text: why it needs no date}}``: settings and example inputs.
EXEMPT: dict[str, dict[str, str]] = {
    "docs/calibration.md": {
        "move by 5%": "the fit's threshold for moving a factor (a setting)",
        "some run by 5%": "the same threshold",
        "(5 % over its range)": "the same threshold, for the network factor",
    },
    "docs/cost-model.md": {
        "3 GiB of framework overhead": "a constant of the memory model, not a measurement",
    },
    "docs/serving.md": {
        "within 2 s and 50 ms": "the example's latency targets (inputs)",
    },
    "docs/sweeps.md": {
        "default 10 s": "the worker heartbeat's default (a setting)",
        "0.5 s doubling to 10 s": "the retry backoff (a setting)",
    },
}


@dataclass
class Quote:
    line: int
    raw: str  # the line as written
    text: str  # without its inline code
    context: str


def _blank_code(text: str) -> list[str]:
    """The page's lines with fenced code blocks blanked and inline code (which may run
    over a line break) removed."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    text = re.sub(r"`(?:[^`\n]|\n(?!\s*\n))*`", lambda m: re.sub(r"[^\n]", "", m.group(0)),
                  "\n".join(lines))
    return text.split("\n")


def _is_item(line: str) -> bool:
    return re.match(r"\s*(?:[-*+]|\d+[.)])\s", line) is not None


def quotes(text: str) -> list[Quote]:
    """Every line of a page that quotes a number, with the text its date may be in."""
    raw = text.split("\n")
    lines = _blank_code(text)
    blocks: list[list[int]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        heading = line.startswith("#")
        if blocks and blocks[-1][-1] == i - 1 and not heading and not lines[i - 1].startswith("#"):
            blocks[-1].append(i)
        else:
            blocks.append([i])  # a heading is a block of its own
    found: list[Quote] = []
    headings: list[tuple[int, str]] = []
    previous = ""  # the paragraph before this block
    for block in blocks:
        block_lines = [lines[i] for i in block]
        if block_lines[0].startswith("#"):
            level = len(block_lines[0]) - len(block_lines[0].lstrip("#"))
            headings = [h for h in headings if h[0] < level] + [(level, block_lines[0])]
            previous = ""
            continue
        above = " ".join(h for _, h in headings)
        if block_lines[0].lstrip().startswith("|"):
            header = block_lines[0]
            units = [[i] for i in block]
            shared = f"{previous} {header}"
        elif any(_is_item(line) for line in block_lines):
            # a paragraph running straight into a list is a unit of its own, then each
            # item with its continuation lines
            units = []
            for i in block:
                if _is_item(lines[i]) or not units:
                    units.append([i])
                else:
                    units[-1].append(i)
            lead = "" if _is_item(block_lines[0]) else " ".join(lines[i] for i in units[0])
            shared = lead or previous
            shared = shared if shared.rstrip().endswith(":") else ""
        else:
            units = [block]
            shared = ""
        for unit in units:
            context = " ".join(lines[i] for i in unit) + f" {shared} {above}"
            found.extend(Quote(i + 1, raw[i], lines[i], context) for i in unit
                         if NUMBER.search(lines[i]))
        previous = " ".join(block_lines)
    return found


def undated(text: str, exempt: dict[str, str] | None = None) -> list[str]:
    """``line: text`` of every quoted number with no date in its context."""
    bad = []
    for quote in quotes(text):
        line = quote.text
        for phrase in exempt or {}:
            line = line.replace(phrase, "")
        if NUMBER.search(line) and not DATE.search(quote.context):
            bad.append(f"{quote.line}: {quote.raw.strip()[:120]}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_number_is_dated(page: Path) -> None:
    name = str(page.relative_to(ROOT))
    bad = undated(page.read_text(encoding="utf-8"), EXEMPT.get(name))
    assert not bad, (f"{name}: numbers quoted without a YYYY-MM-DD date in their paragraph, "
                     "item, table caption or section heading:\n" + "\n".join(bad))


def test_exemptions_still_name_text_on_their_page() -> None:
    for name, phrases in EXEMPT.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        for phrase in phrases:
            assert phrase in text, f"{name} no longer says {phrase!r}: delete it from EXEMPT"


# --- the check itself catches what it should -----------------------------------------------


@pytest.mark.parametrize(("text", "flagged"), [
    ("The MAPE is 5.0% on Hopper.\n", [1]),
    ("The MAPE is 5.0% on Hopper (2026-12-02).\n", []),
    ("## Accuracy (2026-12-02)\n\nThe MAPE is 5.0%.\n\n### Hopper\n\nIt peaks at 70 GiB.\n",
     []),
    ("## Accuracy (2026-12-02)\n\n## Speed\n\nStep time 4.2 s, 1.8x faster.\n", [5]),
    ("Measured 2026-12-06:\n\n| case | MAPE |\n|---|---|\n| dense | 9.3% |\n", []),
    ("Measured on the set:\n\n| case | MAPE |\n|---|---|\n| dense | 9.3% |\n", [5]),
    ("Numbers of 2026-12-06:\n- dense 9.3%\n- MoE 31.3%\n", []),
    ("- dense 9.3% (2026-12-06)\n- MoE 31.3%\n", [2]),
    ("Run `--heartbeat 10 s` or:\n\n```\nparsearch serve --tpot-ms 50 # 12.5 tokens/s\n```\n",
     []),
    ("It reads 400 GB/s and 1,200 tokens/s.\n", [1]),
    ("A 2-way split of 8 GPUs, 64 experts, 3 stages.\n", []),
    ("Numbers of 2026-12-06:\n\n## Serving\n| case | MAPE |\n|---|---|\n| MoE | 31.3% |\n", [6]),
    ("## Serving (2026-12-06)\nMoE 31.3%.\n", []),
])
def test_the_check_flags_undated_numbers(text: str, flagged: list[int]) -> None:
    assert [int(line.split(":")[0]) for line in undated(text)] == flagged


def test_an_exemption_covers_only_its_own_text() -> None:
    text = "Retries after 0.5 s doubling to 10 s; a step takes 4.2 s.\n"
    assert undated(text, {"0.5 s doubling to 10 s": "a setting"}) == [
        "1: Retries after 0.5 s doubling to 10 s; a step takes 4.2 s."]
    assert undated("Retries after 0.5 s doubling to 10 s.\n",
                   {"0.5 s doubling to 10 s": "a setting"}) == []
